// See op_work.h.
#include "kernels/op_work.h"

namespace flashgpt {
namespace {

double bytes_of(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }

// Score-matrix entries attended: T² per (b, h), about half of it when causal.
double attended(int B, int H, int T, bool causal) {
  const double full = double(B) * H * double(T) * T;
  return causal ? full / 2 : full;
}

}  // namespace

OpWork bytes_work(std::initializer_list<const Tensor*> read, std::initializer_list<const Tensor*> written,
                  std::initializer_list<const Tensor*> updated) {
  OpWork w;
  for (const Tensor* t : read) w.bytes += bytes_of(*t);
  for (const Tensor* t : written) w.bytes += bytes_of(*t);
  for (const Tensor* t : updated) w.bytes += 2 * bytes_of(*t);
  return w;
}

OpWork matmul_forward_work(const MatmulForward& a) {
  const double OC = double(a.weight.shape[0]), C = double(a.weight.shape[1]);
  const double N = double(a.inp.numel()) / C;
  OpWork w = bytes_work({&a.inp, &a.weight, &a.bias}, {&a.out, &a.pre_gelu});
  w.flops = 2 * N * C * OC;
  return w;
}

OpWork matmul_backward_work(const MatmulBackward& a) {
  const double OC = double(a.weight.shape[0]), C = double(a.weight.shape[1]);
  const double N = double(a.dout.numel()) / OC;
  OpWork w = bytes_work({&a.dout, &a.dinp_gelu_pre}, {&a.dinp}, {&a.dweight, &a.dbias});
  if (a.dinp.defined()) w.flops += 2 * N * C * OC, w.bytes += bytes_of(a.weight);  // dout·W
  if (a.dweight.defined()) w.flops += 2 * N * C * OC, w.bytes += bytes_of(a.inp);   // doutᵀ·inp
  return w;
}

OpWork attention_forward_work(const AttentionForward& a) {
  OpWork w = bytes_work({&a.qkv}, {&a.out, &a.lse, &a.probs});
  w.flops = 4 * attended(a.B, a.H, a.T, a.causal) * a.D;
  return w;
}

OpWork attention_backward_work(const AttentionBackward& a) {
  OpWork w = bytes_work({&a.dout, &a.qkv, &a.out, &a.lse, &a.probs}, {&a.dqkv});
  w.flops = 2.5 * 4 * attended(a.B, a.H, a.T, a.causal) * a.D;
  return w;
}

}  // namespace flashgpt
