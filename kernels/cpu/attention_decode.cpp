// CPU decoding attention and the KV-cache append: the reference of the CUDA
// FlashDecoding kernels (kernels/cuda/attention/flash_decode.cu), and the CPU sampler's
// path. Plain loops: for each (b, h), the new token's query against the T cached keys,
//   s_j = q·k_j·scale,  m = max_j s_j,  l = Σ_j exp(s_j − m),
//   out = Σ_j exp(s_j − m)·v_j / l,  lse = m + log l.
// Accumulation in T (float or double), like attention_forward_flash. OpenMP over (b, h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "cpu_kernels.h"

namespace flashgpt::cpu {

template <class T> void attention_decode(const AttentionDecode& a) {
  const int64_t B = a.B, H = a.H, D = a.D, Tn = a.T, Tmax = a.k_cache.size(2);
  const T scale = T(1) / std::sqrt(T(D));
  const T* qkv = a.qkv.as<T>();
  const T* kc = a.k_cache.as<T>();
  const T* vc = a.v_cache.as<T>();
  T* out = a.out.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(B * H * Tn * D))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const T* q = qkv + b * 3 * H * D + h * D;         // q of (b, h): slot 0 of (3, H, D)
    const T* k = kc + bh * Tmax * D;                  // (Tmax, D) of this head
    const T* v = vc + bh * Tmax * D;
    std::vector<T> s(static_cast<size_t>(Tn));
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < Tn; ++j) {
      T dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[d] * k[j * D + d];
      s[size_t(j)] = dot * scale;
      m = std::max(m, s[size_t(j)]);
    }
    T l = 0;
    std::vector<T> o(static_cast<size_t>(D), T(0));
    for (int64_t j = 0; j < Tn; ++j) {
      const T p = std::exp(s[size_t(j)] - m);
      l += p;
      for (int64_t d = 0; d < D; ++d) o[size_t(d)] += p * v[j * D + d];
    }
    T* y = out + b * H * D + h * D;
    for (int64_t d = 0; d < D; ++d) y[d] = o[size_t(d)] / l;
    if (a.lse.defined()) StatView(a.lse).set(bh, double(m + std::log(l)));
  }
}

template <class T> void kv_cache_write(const KVCacheWrite& a) {
  const int64_t B = a.B, n = a.n, H = a.H, D = a.D, Tmax = a.k_cache.size(2);
  const T* qkv = a.qkv.as<T>();
  T* kc = a.k_cache.as<T>();
  T* vc = a.v_cache.as<T>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const T* src = qkv + ((b * n + t) * 3 * H + h) * D;  // k at slot 1, v at slot 2
        const int64_t dst = ((b * H + h) * Tmax + a.pos + t) * D;
        std::copy_n(src + H * D, D, kc + dst);
        std::copy_n(src + 2 * H * D, D, vc + dst);
      }
}

template void attention_decode<float>(const AttentionDecode&);
template void attention_decode<double>(const AttentionDecode&);
template void kv_cache_write<float>(const KVCacheWrite&);
template void kv_cache_write<double>(const KVCacheWrite&);

}  // namespace flashgpt::cpu
