// FlashAttention for flashgpt: fused causal/non-causal attention that never stores the
// T×T matrix. Forward writes O and the logsumexp (LSE) per row; backward recomputes P
// from Q, K and LSE. Called by the CUDA op set (kernels/cuda/) for AttentionAlgo::flash.
#pragma once
#include <cuda_runtime.h>
#include "kernels/ops.h"

namespace flashgpt::cuda {

// a.out (B,T,H,D) bf16 and a.lse (B,H,T) fp32 are overwritten; a.qkv is (B,T,3,H,D).
void flash_attention_forward(const AttentionForward& a, cudaStream_t stream);
// a.dqkv (B,T,3,H,D) is overwritten. workspace: flash_attention_workspace_bytes(...)
// bytes of device memory (e.g. the fp32 dQ accumulator), owned by the caller.
void flash_attention_backward(const AttentionBackward& a, void* workspace, cudaStream_t stream);
size_t flash_attention_workspace_bytes(int B, int T, int H, int D);

}  // namespace flashgpt::cuda
