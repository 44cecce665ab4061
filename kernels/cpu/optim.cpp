// CPU kernels of the optimizer step: AdamW, sum of squares (for clipping), scale.
#include <algorithm>
#include <cmath>
#include <vector>
#include "cpu_kernels.h"

namespace flashgpt::cpu {

namespace {
// sum_squares sums fixed chunks in parallel, then the partials in order: the result does
// not depend on the thread count.
constexpr int64_t kSumChunk = 1 << 14;
}  // namespace

// AdamW with decoupled weight decay, on param in place (CPU: no master copy):
//   g = grad·grad_scale;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²
//   p -= lr·( m/(1-β1^step) / (sqrt(v/(1-β2^step)) + eps) + wd·p )
template <class T> void adamw_update(const AdamWArgs& a) {
  const int64_t n = a.param.numel();
  T* p = a.param.as<T>();
  T* m = a.m.as<T>();
  T* v = a.v.as<T>();
  const T* g = a.grad.as<T>();
  const T beta1 = a.beta1, beta2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay;
  const T gs = a.grad_scale;
  const T bias1 = T(1) - std::pow(beta1, T(a.step));
  const T bias2 = T(1) - std::pow(beta2, T(a.step));
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i] * gs;
    m[i] = beta1 * m[i] + (T(1) - beta1) * gi;
    v[i] = beta2 * v[i] + (T(1) - beta2) * gi * gi;
    const T mhat = m[i] / bias1, vhat = v[i] / bias2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

// out[0] += Σ grad², accumulated in double.
template <class T> void sum_squares(StatView out, Tensor grad) {
  const int64_t n = grad.numel();
  const T* g = grad.as<T>();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t k = 0; k < chunks; ++k) {
    double s = 0;
    for (int64_t i = k * kSumChunk; i < std::min(n, (k + 1) * kSumChunk); ++i)
      s += double(g[i]) * double(g[i]);
    partial[k] = s;
  }
  double total = out.get(0);
  for (double s : partial) total += s;
  out.set(0, total);
}

template <class T> void scale(Tensor x, float s) {
  const int64_t n = x.numel();
  T* p = x.as<T>();
  const T f = s;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) p[i] *= f;
}

#define FG_INSTANTIATE(T)                                  \
  template void adamw_update<T>(const AdamWArgs&);         \
  template void sum_squares<T>(StatView, Tensor);          \
  template void scale<T>(Tensor, float);
FG_INSTANTIATE(float)
FG_INSTANTIATE(double)
#undef FG_INSTANTIATE

}  // namespace flashgpt::cpu
