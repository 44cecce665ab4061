// CPU matmul, the hot op of CPU training: out (N,OC) = inp (N,C) · Wᵀ + b, optional GELU
// epilogue in forward and DGELU epilogue on dinp in backward (see ops.h).
//
// Every product is computed by one kernel, gemm_nn: out (M,P) (+)= A (M,K) · B (K,P),
// all row-major. Its inner loop is an axpy over a row of B (acc[j] += a·B[k,j]), which
// the compiler vectorises without reordering any sum (a dot-product inner loop would
// need -ffast-math to vectorise). A tile of kRowBlock rows × kColBlock columns of out
// stays in registers/L1 while k walks the whole depth, so each B row segment loaded is
// used kRowBlock times. Each output element is summed in k order whatever the thread
// count: results are deterministic.
//   forward:   out    = inp · Wᵀ     A = inp (N,C),    B = Wᵀ (C,OC)  (transposed copy)
//   dinp:      dinp   = dout · W     A = dout (N,OC),  B = W (OC,C)
//   dweight:   dW    += doutᵀ · inp  A = doutᵀ (OC,N), B = inp (N,C)  (transposed copy)
#include <algorithm>
#include <vector>
#include "cpu_kernels.h"

namespace flashgpt::cpu {

namespace {
constexpr int64_t kRowBlock = 4;   // rows of out per tile (reuse of each B load)
constexpr int64_t kColBlock = 32;  // columns of out per tile: 4×32 accumulators
constexpr int64_t kFewRows = 8;    // forward with fewer rows: dot products, no transposed copy of W

// Reused transposition buffer (grown, never shrunk): no allocation per step.
template <class T> T* scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// dst (cols, rows) = srcᵀ, src (rows, cols).
template <class T> void transpose(T* dst, const T* src, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(rows * cols))
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * rows + r] = src[r * cols + c];
}

// One tile of out at (r0, c0). kFull: the tile is whole, so the bounds are compile-time
// constants and the compiler unrolls and keeps acc in registers.
template <class T, bool kFull>
void gemm_tile(T* out, const T* A, const T* B, int64_t K, int64_t P, int64_t r0, int64_t c0,
               int64_t rows_left, int64_t cols_left, bool accumulate) {
  const int64_t rows = kFull ? kRowBlock : std::min(kRowBlock, rows_left);
  const int64_t cols = kFull ? kColBlock : std::min(kColBlock, cols_left);
  T acc[kRowBlock][kColBlock];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) acc[r][j] = accumulate ? out[(r0 + r) * P + c0 + j] : T(0);
  for (int64_t k = 0; k < K; ++k) {
    const T* b = B + k * P + c0;
    for (int64_t r = 0; r < rows; ++r) {
      const T a = A[(r0 + r) * K + k];
      for (int64_t j = 0; j < cols; ++j) acc[r][j] += a * b[j];
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[(r0 + r) * P + c0 + j] = acc[r][j];
}

// out (M,P) = (accumulate ? out : 0) + A (M,K) · B (K,P).
template <class T>
void gemm_nn(T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  const int64_t row_tiles = (M + kRowBlock - 1) / kRowBlock;
  const int64_t col_tiles = (P + kColBlock - 1) / kColBlock;
#pragma omp parallel for collapse(2) schedule(static) if (cpu::worth_parallel(M * K * P))
  for (int64_t rt = 0; rt < row_tiles; ++rt)
    for (int64_t ct = 0; ct < col_tiles; ++ct) {
      const int64_t r0 = rt * kRowBlock, c0 = ct * kColBlock;
      if (r0 + kRowBlock <= M && c0 + kColBlock <= P)
        gemm_tile<T, true>(out, A, B, K, P, r0, c0, 0, 0, accumulate);
      else
        gemm_tile<T, false>(out, A, B, K, P, r0, c0, M - r0, P - c0, accumulate);
    }
}
}  // namespace

template <class T> void matmul_forward(const MatmulForward& a) {
  const int64_t C = a.inp.size(-1), N = a.inp.numel() / C, OC = a.weight.size(0);
  // With GELU, the pre-activation is kept for backward; out gets GELU of it.
  T* pre = a.gelu ? a.pre_gelu.as<T>() : a.out.as<T>();
  if (N < kFewRows) {
    // A few rows (decoding one token per sequence): dot products against W in place, each
    // summed in k order like gemm_tile, instead of transposing all of W for them.
    const T* inp = a.inp.as<T>();
    const T* w = a.weight.as<T>();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(N * C * OC))
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t n = 0; n < N; ++n) {
        T acc = 0;
        for (int64_t k = 0; k < C; ++k) acc += inp[n * C + k] * w[o * C + k];
        pre[n * OC + o] = acc;
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
  if (a.dweight.defined()) {  // dW (OC,C) += doutᵀ (OC,N) · inp (N,C)
    T* dout_t = scratch<T>(size_t(N * OC));
    transpose(dout_t, dout, N, OC);
    gemm_nn(a.dweight.as<T>(), dout_t, a.inp.as<T>(), OC, N, C, /*accumulate=*/true);
  }
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
