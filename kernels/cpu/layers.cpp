// CPU kernels of the small layers: embedding, layernorm, GELU, fused softmax +
// cross-entropy. Plain loops; OpenMP over rows (or over channels where rows would race).
#include <algorithm>
#include <cmath>
#include <vector>
#include "cpu_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/softmax_ce.h"

namespace flashgpt::cpu {

namespace {
constexpr double kLayerNormEps = 1e-5;
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
// Channels per OpenMP task where tasks own disjoint channels (deterministic sums).
constexpr int64_t kChannelChunk = 64;
}  // namespace

// ---- GELU, tanh approximation: 0.5·x·(1 + tanh(sqrt(2/pi)·(x + 0.044715·x³))) ----
template <class T> T gelu(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

template <class T> T gelu_grad(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
  const T th = std::tanh(u);
  const T du_dx = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
  return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du_dx;
}

template <class T> void gelu_forward(Tensor out, Tensor inp) {
  const int64_t n = inp.numel();
  T* o = out.as<T>();
  const T* x = inp.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) o[i] = gelu(x[i]);
}

// dinp = GELU'(inp) · dout, overwritten (dinp may alias dout).
template <class T> void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const int64_t n = inp.numel();
  T* dx = dinp.as<T>();
  const T* x = inp.as<T>();
  const T* dy = dout.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i]) * dy[i];
}

// ---- embedding ----
// out (B,T,C) = wte[tokens[b,t]] + wpe[t] (no wpe: rotary positions); overwrites.
template <class T> void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
  const int64_t B = tokens.size(0), Tn = tokens.size(1), C = wte.size(1), V = wte.size(0);
  const int32_t* tok = tokens.as<int32_t>();
  T* o = out.as<T>();
  const T* te = wte.as<T>();
  const T* pe = wpe.defined() ? wpe.as<T>() : nullptr;
  // Checked before the parallel loop: an exception must not leave an OpenMP region.
  for (int64_t bt = 0; bt < B * Tn; ++bt)
    FG_ASSERT(tok[bt] >= 0 && tok[bt] < V, "token id ", tok[bt], " outside the vocabulary of ", V);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(B * Tn * C))
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const int64_t id = tok[bt], t = bt % Tn;
    if (pe)
      for (int64_t c = 0; c < C; ++c) o[bt * C + c] = te[id * C + c] + pe[t * C + c];
    else
      for (int64_t c = 0; c < C; ++c) o[bt * C + c] = te[id * C + c];
  }
}

// dwte, dwpe accumulate. A token may repeat, so rows of dwte would race; instead each
// task owns a slice of channels and walks all positions in order (deterministic).
template <class T>
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
  const int64_t B = tokens.size(0), Tn = tokens.size(1), C = dwte.size(1);
  const int32_t* tok = tokens.as<int32_t>();
  T* dte = dwte.as<T>();
  T* dpe = dwpe.defined() ? dwpe.as<T>() : nullptr;
  const T* d = dout.as<T>();
  const int64_t chunks = (C + kChannelChunk - 1) / kChannelChunk;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(B * Tn * C))
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * kChannelChunk, c1 = std::min(C, c0 + kChannelChunk);
    for (int64_t bt = 0; bt < B * Tn; ++bt) {
      const int64_t id = tok[bt], t = bt % Tn;
      for (int64_t c = c0; c < c1; ++c) {
        dte[id * C + c] += d[bt * C + c];
        if (dpe) dpe[t * C + c] += d[bt * C + c];
      }
    }
  }
}

// ---- rotary position embedding (see kRopeBase in ops.h), in place ----
// Row n = b·T + t of qkv (N, 3·H·D): in q and k of each head, (x_i, x_{i+D/2}) becomes
// (x_i·cos − x_{i+D/2}·sin, x_{i+D/2}·cos + x_i·sin) with angle ±(pos0 + t)·θ_i; cos and
// sin are computed in fp64 and rounded to T.
template <class T> void rope(Tensor qkv, int64_t Tn, int H, bool inverse, int64_t pos0) {
  const int64_t N = qkv.size(0), HD = qkv.size(1) / 3, D = HD / H, half = D / 2;
  T* x = qkv.as<T>();
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = rope_inv_freq(int(i), int(D));
  const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * 2 * HD))
  for (int64_t n = 0; n < N; ++n) {
    const double t = double(pos0 + n % Tn);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = t * inv_freq[size_t(i)];
      const T c = T(std::cos(angle)), s = T(sign * std::sin(angle));
      for (int64_t part = 0; part < 2; ++part)  // q, then k
        for (int64_t h = 0; h < H; ++h) {
          T* head = x + n * 3 * HD + part * HD + h * D;
          const T a = head[i], b = head[i + half];
          head[i] = a * c - b * s;
          head[i + half] = b * c + a * s;
        }
    }
  }
}

// ---- layernorm ----
// out (N,C) = (inp - mean)·rstd·w + b, rstd = 1/sqrt(var + eps), biased variance.
template <class T>
void layernorm_forward(Tensor out, StatView mean, StatView rstd, Tensor inp, Tensor weight,
                       Tensor bias) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  T* o = out.as<T>();
  const T* x = inp.as<T>();
  const T* w = weight.as<T>();
  const T* b = bias.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += xr[c];
    const double mu = sum / double(C);
    double var = 0;  // two passes: no cancellation from E[x²] - E[x]²
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / std::sqrt(var / double(C) + kLayerNormEps);
    // Normalise with the values as saved, so backward sees exactly what forward used.
    mean.set(n, mu);
    rstd.set(n, rs);
    const T m = T(mean.get(n)), r = T(rstd.get(n));
    for (int64_t c = 0; c < C; ++c) o[n * C + c] = (xr[c] - m) * r * w[c] + b[c];
  }
}

// With xhat = (x - mean)·rstd and g = dout·w:
//   dinp += rstd·(g - mean(g) - xhat·mean(g·xhat)),  dweight += Σ dout·xhat,  dbias += Σ dout.
template <class T>
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, StatView mean, StatView rstd) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  T* dx = dinp.as<T>();
  T* dw = dweight.as<T>();
  T* db = dbias.as<T>();
  const T* dy = dout.as<T>();
  const T* x = inp.as<T>();
  const T* w = weight.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T m = T(mean.get(n)), r = T(rstd.get(n));
    const T* xr = x + n * C;
    const T* dyr = dy + n * C;
    double g_sum = 0, gx_sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T g = dyr[c] * w[c];
      g_sum += g;
      gx_sum += g * ((xr[c] - m) * r);
    }
    const T g_mean = T(g_sum / double(C)), gx_mean = T(gx_sum / double(C));
    for (int64_t c = 0; c < C; ++c) {
      const T xhat = (xr[c] - m) * r;
      dx[n * C + c] += r * (dyr[c] * w[c] - g_mean - xhat * gx_mean);
    }
  }
  // Parameter gradients: each task owns a slice of channels, rows summed in order.
  const int64_t chunks = (C + kChannelChunk - 1) / kChannelChunk;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * C))
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * kChannelChunk, c1 = std::min(C, c0 + kChannelChunk);
    for (int64_t n = 0; n < N; ++n) {
      const T m = T(mean.get(n)), r = T(rstd.get(n));
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += dy[n * C + c] * ((x[n * C + c] - m) * r);
        db[c] += dy[n * C + c];
      }
    }
  }
}

// ---- fused softmax + cross-entropy over a padded vocabulary ----
// Its rows run softmax_ce.h's kernel at the CPU's level (the tests pick a level).
namespace {
template <class T>
using CeRowFn = double (*)(T*, int64_t, int64_t, int64_t, float, double*);
template <class T>
CeRowFn<T> ce_row_kernel(int level) {
  const CeRowFn<T> fns[] = {v2::ce_row, v3::ce_row, v4::ce_row};
  return fns[level_index(level)];
}
}  // namespace
template <class T>
double ce_row_at(int level, T* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e) {
  return ce_row_kernel<T>(level)(row, V, Vp, target, dloss, e);
}
template double ce_row_at<float>(int, float*, int64_t, int64_t, int64_t, float, double*);
template double ce_row_at<double>(int, double*, int64_t, int64_t, int64_t, float, double*);
double exp_nonpositive_at(int level, double x) {
  double (*const fns[])(double) = {v2::exp_nonpositive_at_level, v3::exp_nonpositive_at_level,
                                   v4::exp_nonpositive_at_level};
  return fns[level_index(level)](x);
}

template <class T>
void softmax_cross_entropy(StatView losses, Tensor logits, Tensor targets, int V, float dloss) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  T* lg = logits.as<T>();
  const int32_t* tg = targets.as<int32_t>();
  // Checked before the parallel loop: an exception must not leave an OpenMP region.
  for (int64_t n = 0; n < N; ++n)
    FG_ASSERT(tg[n] < V, "target ", tg[n], " outside the vocabulary of ", V);
  const CeRowFn<T> ce_row = ce_row_kernel<T>(gemm_level());  // chosen once, outside the parallel loop
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * Vp))
  for (int64_t n = 0; n < N; ++n) {
    T* row = lg + n * Vp;
    const int64_t target = tg[n];
    if (target < 0) {  // ignored position: no loss, no gradient
      losses.set(n, 0.0);
      if (dloss != 0) std::fill(row, row + Vp, T(0));
      continue;
    }
    // One exponential per logit, kept (in double) for the gradient: p = e / sum
    // (softmax_ce.h, at the CPU's vector level).
    thread_local std::vector<double> e;
    e.resize(size_t(V));
    losses.set(n, ce_row(row, V, Vp, target, dloss, e.data()));
  }
}

#define FG_INSTANTIATE(T)                                                                   \
  template T gelu<T>(T);                                                                    \
  template T gelu_grad<T>(T);                                                               \
  template void gelu_forward<T>(Tensor, Tensor);                                            \
  template void gelu_backward<T>(Tensor, Tensor, Tensor);                                   \
  template void embedding_forward<T>(Tensor, Tensor, Tensor, Tensor);                       \
  template void embedding_backward<T>(Tensor, Tensor, Tensor, Tensor);                      \
  template void layernorm_forward<T>(Tensor, StatView, StatView, Tensor, Tensor, Tensor);   \
  template void layernorm_backward<T>(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,       \
                                      StatView, StatView);                                  \
  template void softmax_cross_entropy<T>(StatView, Tensor, Tensor, int, float);          \
  template void rope<T>(Tensor, int64_t, int, bool, int64_t);
FG_INSTANTIATE(float)
FG_INSTANTIATE(double)
#undef FG_INSTANTIATE

}  // namespace flashgpt::cpu
