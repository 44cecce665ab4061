// The work of one op call, for the roofline table of `flashgpt bench train --breakdown`
// (issue: where does the step's time go?): floating-point operations (a multiply-add is
// 2; attention by the FlashAttention convention, 4·B·H·T²·D forward, halved when causal,
// backward 2.5× forward) and the bytes an ideal kernel moves to and from device memory
// (every input read once, every output written once, accumulators read and written).
// Pure arithmetic on the call's tensors: no device, tested on the CPU.
#pragma once
#include <initializer_list>
#include "kernels/ops.h"

namespace flashgpt {

struct OpWork {
  double flops = 0, bytes = 0;
};

OpWork matmul_forward_work(const MatmulForward& a);
OpWork matmul_backward_work(const MatmulBackward& a);
OpWork attention_forward_work(const AttentionForward& a);
OpWork attention_backward_work(const AttentionBackward& a);
// Memory-bound ops: the bytes of what they read and what they write (flops 0).
OpWork bytes_work(std::initializer_list<const Tensor*> read, std::initializer_list<const Tensor*> written,
                  std::initializer_list<const Tensor*> updated = {});

}  // namespace flashgpt
