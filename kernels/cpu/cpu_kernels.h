// Internal to kernels/cpu/: the CPU op set's kernels, templated on the element type
// T (float or double), instantiated for both in their .cpp files. cpu_ops.cpp checks
// shapes/dtypes once and dispatches here. See kernels/ops.h for the semantics.
//
// Precision: dot products and matrix products (matmul, attention) accumulate in T,
// like the GPU accumulates bf16 products in fp32. Row reductions that are cheap next
// to the work around them (layernorm mean/variance, softmax sums in cross-entropy,
// sum_squares) accumulate in double for both types.
#pragma once
#include <cstdint>
#include "kernels/ops.h"

namespace flashgpt::cpu {

// Loops with less work than this (multiply-adds or elements, ~0.1 ms) run on one thread:
// waking the OpenMP team costs microseconds on an idle machine and far more on a busy
// one (spinning threads compete for the cores), more than such a loop itself. Small ops
// are common: tiny models, tests, finite-difference checks.
constexpr int64_t kMinParallelWork = 1 << 18;
inline bool worth_parallel(int64_t work) { return work >= kMinParallelWork; }

// Per-row statistics (layernorm mean/rstd, attention lse/delta, losses, the
// sum_squares scalar) live in fp32 in fp32 runs and fp64 in fp64 runs. This view reads
// and writes either, so the kernels are not instantiated per statistics dtype.
struct StatView {
  void* data;
  DType dtype;
  explicit StatView(const Tensor& t) : data(t.data), dtype(t.dtype) {
    FG_ASSERT(t.dtype == DType::f32 || t.dtype == DType::f64,
              "statistics tensor must be fp32 or fp64, got ", dtype_name(t.dtype));
  }
  double get(int64_t i) const {
    return dtype == DType::f64 ? static_cast<const double*>(data)[i]
                               : double(static_cast<const float*>(data)[i]);
  }
  void set(int64_t i, double v) const {
    if (dtype == DType::f64) static_cast<double*>(data)[i] = v;
    else static_cast<float*>(data)[i] = float(v);
  }
};

// The tanh approximation of GELU (GPT-2's) and its derivative.
template <class T> T gelu(T x);
template <class T> T gelu_grad(T x);

template <class T> void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe);
template <class T> void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens);
template <class T>
void layernorm_forward(Tensor out, StatView mean, StatView rstd, Tensor inp, Tensor weight,
                       Tensor bias);
template <class T>
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, StatView mean, StatView rstd);
template <class T> void rope(Tensor qkv, int64_t T_len, int H, bool inverse, int64_t pos0);
template <class T> void gelu_forward(Tensor out, Tensor inp);
template <class T> void gelu_backward(Tensor dinp, Tensor inp, Tensor dout);
template <class T>
void softmax_cross_entropy(StatView losses, Tensor logits, Tensor targets, int V, float dloss);

template <class T> void matmul_forward(const MatmulForward& a);
template <class T> void matmul_backward(const MatmulBackward& a);

template <class T> void attention_forward_naive(const AttentionForward& a);
template <class T> void attention_backward_naive(const AttentionBackward& a);
template <class T> void attention_forward_flash(const AttentionForward& a);
template <class T> void attention_backward_flash(const AttentionBackward& a);

template <class T> void attention_decode(const AttentionDecode& a);
template <class T> void kv_cache_write(const KVCacheWrite& a);

template <class T> void adamw_update(const AdamWArgs& a);
template <class T> void sum_squares(StatView out, Tensor grad);
template <class T> void scale(Tensor x, float s);

}  // namespace flashgpt::cpu
