// CPU matmul, the hot op of CPU training: out (N,OC) = inp (N,C) · Wᵀ + b, optional GELU
// epilogue in forward and DGELU epilogue on dinp in backward (see ops.h).
//
// Every product is computed by one kernel, gemm_nn or gemm_tn (gemm.h, gemm_kernel.cpp):
// out (M,P) (+)= A (M,K) · B (K,P), all row-major (gemm_tn: A given transposed), each
// output element summed in k order whatever the thread count and the CPU's vector width:
// results are deterministic.
//   forward:   out    = inp · Wᵀ     A = inp (N,C),    B = Wᵀ (C,OC)  (transposed copy)
//   dinp:      dinp   = dout · W     A = dout (N,OC),  B = W (OC,C)
//   dweight:   dW    += doutᵀ · inp  A = doutᵀ (OC,N), B = inp (N,C)  (gemm_tn: dout read in place)
#include <algorithm>
#include <vector>
#include "cpu_kernels.h"
#include "kernels/cpu/gemm.h"

namespace flashgpt::cpu {

int gemm_level() {
  static const int level = __builtin_cpu_supports("x86-64-v4") ? 4 : __builtin_cpu_supports("x86-64-v3") ? 3 : 2;
  return level;
}
int level_index(int level) {
  FG_ASSERT(level >= 2 && level <= gemm_level(), "vector level ", level, " on a CPU of level ", gemm_level());
  return level - 2;
}

namespace {
// The kernel of one level, A as it is (nn) or given transposed (tn).
template <class T>
using GemmFn = void (*)(T*, const T*, const T*, int64_t, int64_t, int64_t, bool);
template <class T>
GemmFn<T> gemm_at(int level, bool a_transposed) {
  const GemmFn<T> nn[] = {v2::gemm_nn, v3::gemm_nn, v4::gemm_nn}, tn[] = {v2::gemm_tn, v3::gemm_tn, v4::gemm_tn};
  return (a_transposed ? tn : nn)[level_index(level)];
}
}  // namespace

template <class T>
void gemm_nn_at(int level, T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm_at<T>(level, false)(out, A, B, M, K, P, accumulate);
}
template <class T>
void gemm_tn_at(int level, T* out, const T* At, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm_at<T>(level, true)(out, At, B, M, K, P, accumulate);
}
template void gemm_nn_at<float>(int, float*, const float*, const float*, int64_t, int64_t, int64_t, bool);
template void gemm_nn_at<double>(int, double*, const double*, const double*, int64_t, int64_t, int64_t, bool);
template void gemm_tn_at<float>(int, float*, const float*, const float*, int64_t, int64_t, int64_t, bool);
template void gemm_tn_at<double>(int, double*, const double*, const double*, int64_t, int64_t, int64_t, bool);

namespace {
constexpr int64_t kFewRows = 8;    // forward with fewer rows: dot products, no transposed copy of W

// Reused buffer of the forward's Wᵀ (grown, never shrunk): no allocation per step.
template <class T> T* scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// dst (cols, rows) = srcᵀ, src (rows, cols), in 32 × 32 blocks: each block's source
// rows and destination rows stay in cache while it is copied.
template <class T> void transpose(T* dst, const T* src, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 32;
#pragma omp parallel for collapse(2) schedule(static) if (cpu::worth_parallel(rows * cols))
  for (int64_t c0 = 0; c0 < cols; c0 += kBlock)
    for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
      for (int64_t c = c0; c < std::min(cols, c0 + kBlock); ++c)
        for (int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r) dst[c * rows + r] = src[r * cols + c];
}
}  // namespace

template <class T> void matmul_forward(const MatmulForward& a) {
  const int64_t C = a.inp.size(-1), N = a.inp.numel() / C, OC = a.weight.size(0);
  // With GELU, the pre-activation is kept for backward; out gets GELU of it.
  T* pre = a.gelu ? a.pre_gelu.as<T>() : a.out.as<T>();
  if (N < kFewRows) {
    // A few rows (decoding one token per sequence): dot products against W in place, each
    // summed in k order like gemm_nn, instead of transposing all of W for them. kOuts
    // outputs at a time: their sums are independent chains, so the core overlaps their
    // additions instead of waiting out each one's latency.
    constexpr int64_t kOuts = 8;
    const T* inp = a.inp.as<T>();
    const T* w = a.weight.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * C * OC))
    for (int64_t o0 = 0; o0 < OC; o0 += kOuts) {
      const int64_t outs = std::min(kOuts, OC - o0);
      for (int64_t n = 0; n < N; ++n) {
        const T* x = inp + n * C;
        T acc[kOuts] = {};
        if (outs == kOuts) {
          for (int64_t k = 0; k < C; ++k)
            for (int64_t i = 0; i < kOuts; ++i) acc[i] += x[k] * w[(o0 + i) * C + k];
        } else {
          for (int64_t k = 0; k < C; ++k)
            for (int64_t i = 0; i < outs; ++i) acc[i] += x[k] * w[(o0 + i) * C + k];
        }
        for (int64_t i = 0; i < outs; ++i) pre[n * OC + o0 + i] = acc[i];
      }
    }
  } else {
    T* wt = scratch<T>(size_t(C * OC));
    transpose(wt, a.weight.as<T>(), OC, C);
    gemm_nn(pre, a.inp.as<T>(), wt, N, C, OC, /*accumulate=*/false);
  }
  const T* bias = a.bias.defined() ? a.bias.as<T>() : nullptr;
  T* out = a.out.as<T>();
  if (!bias && !a.gelu) return;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * OC))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      T v = pre[n * OC + o] + (bias ? bias[o] : T(0));
      if (a.gelu) {
        pre[n * OC + o] = v;
        v = gelu(v);
      }
      out[n * OC + o] = v;
    }
}

template <class T> void matmul_backward(const MatmulBackward& a) {
  const int64_t C = a.inp.size(-1), N = a.inp.numel() / C, OC = a.weight.size(0);
  const T* dout = a.dout.as<T>();
  if (a.dinp.defined()) {  // dinp (N,C) = dout (N,OC) · W (OC,C), overwritten
    T* dinp = a.dinp.as<T>();
    gemm_nn(dinp, dout, a.weight.as<T>(), N, OC, C, /*accumulate=*/false);
    if (a.dinp_gelu_pre.defined()) {  // DGELU epilogue: inp was GELU(dinp_gelu_pre)
      const T* pre = a.dinp_gelu_pre.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * C))
      for (int64_t i = 0; i < N * C; ++i) dinp[i] *= gelu_grad(pre[i]);
    }
  }
  if (a.dweight.defined())  // dW (OC,C) += doutᵀ (OC,N) · inp (N,C), doutᵀ read in place
    gemm_tn(a.dweight.as<T>(), dout, a.inp.as<T>(), OC, N, C, /*accumulate=*/true);
  if (a.dbias.defined()) {  // dbias (OC) += Σ_n dout[n, :]
    T* db = a.dbias.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * OC))
    for (int64_t o = 0; o < OC; ++o) {
      T s = 0;
      for (int64_t n = 0; n < N; ++n) s += dout[n * OC + o];
      db[o] += s;
    }
  }
}

template void matmul_forward<float>(const MatmulForward&);
template void matmul_forward<double>(const MatmulForward&);
template void matmul_backward<float>(const MatmulBackward&);
template void matmul_backward<double>(const MatmulBackward&);

}  // namespace flashgpt::cpu
