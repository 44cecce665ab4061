// gemm.h's kernel, compiled by CMakeLists.txt once per x86-64 level with
// FLASHGPT_GEMM_LEVEL = 2, 3 or 4 (-march=x86-64-vN -ffp-contract=off): the same source,
// so the same sums in the same order, in 128-, 256- or 512-bit vectors.
//
// Its inner loop is an axpy over a row of B (acc[j] += a·B[k,j]), which the compiler
// vectorises without reordering any sum (a dot-product inner loop would need -ffast-math
// to vectorise); the loop marked [vectorised] must vectorise at every level, which
// tests/scripts/cpu_vectorised.sh asks GCC. A tile of kRowBlock rows × kColBlock columns
// of out stays in registers/L1 while k walks the whole depth, so each B row segment
// loaded is used kRowBlock times.
#include <algorithm>
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/level_namespace.h"

namespace flashgpt::cpu::FLASHGPT_GEMM_NS {

namespace {
// Rows of out per tile (the reuse of each B load) × columns (the accumulators: 6 × 4
// 16-float registers of AVX-512's 32; 4 × 4 of AVX2's 16). Measured on this project's
// shapes (BENCHMARKS.md, "Forty-eighth session"); the tile changes no sum.
#if FLASHGPT_GEMM_LEVEL == 4
constexpr int64_t kRowBlock = 6, kColBlock = 64;
#else
constexpr int64_t kRowBlock = 4, kColBlock = 32;
#endif

// One tile of out at (r0, c0). kFull: the tile is whole, so the bounds are compile-time
// constants and the compiler unrolls and keeps acc in registers. kATrans: A is given
// transposed, (K, M) row-major (gemm_tn), so a tile's rows of A at one k are adjacent.
template <class T, bool kFull, bool kATrans>
void gemm_tile(T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, int64_t r0, int64_t c0,
               int64_t rows_left, int64_t cols_left, bool accumulate) {
  const int64_t rows = kFull ? kRowBlock : std::min(kRowBlock, rows_left);
  const int64_t cols = kFull ? kColBlock : std::min(kColBlock, cols_left);
  T acc[kRowBlock][kColBlock];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) acc[r][j] = accumulate ? out[(r0 + r) * P + c0 + j] : T(0);
  for (int64_t k = 0; k < K; ++k) {
    const T* b = B + k * P + c0;
    for (int64_t r = 0; r < rows; ++r) {
      const T a = kATrans ? A[k * M + r0 + r] : A[(r0 + r) * K + k];
      for (int64_t j = 0; j < cols; ++j) acc[r][j] += a * b[j];  // [vectorised]
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[(r0 + r) * P + c0 + j] = acc[r][j];
}

template <class T, bool kATrans>
void tile_at(T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, int64_t rt, int64_t ct,
             bool accumulate) {
  const int64_t r0 = rt * kRowBlock, c0 = ct * kColBlock;
  if (r0 + kRowBlock <= M && c0 + kColBlock <= P)
    gemm_tile<T, true, kATrans>(out, A, B, M, K, P, r0, c0, 0, 0, accumulate);
  else
    gemm_tile<T, false, kATrans>(out, A, B, M, K, P, r0, c0, M - r0, P - c0, accumulate);
}

// The tiles in the order that reads the larger operand once: when B is the larger (the
// LM head's Wᵀ, K × 50304), a column of tiles walks down all rows while its K × 32 block of
// B stays in cache; otherwise a row of tiles walks across B with its 4 × K rows of A. The
// order changes no sum.
template <class T, bool kATrans>
void gemm(T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  const int64_t row_tiles = (M + kRowBlock - 1) / kRowBlock;
  const int64_t col_tiles = (P + kColBlock - 1) / kColBlock;
  if (K * P > M * K) {
#pragma omp parallel for collapse(2) schedule(static) if (cpu::worth_parallel(M * K * P))
    for (int64_t ct = 0; ct < col_tiles; ++ct)
      for (int64_t rt = 0; rt < row_tiles; ++rt) tile_at<T, kATrans>(out, A, B, M, K, P, rt, ct, accumulate);
  } else {
#pragma omp parallel for collapse(2) schedule(static) if (cpu::worth_parallel(M * K * P))
    for (int64_t rt = 0; rt < row_tiles; ++rt)
      for (int64_t ct = 0; ct < col_tiles; ++ct) tile_at<T, kATrans>(out, A, B, M, K, P, rt, ct, accumulate);
  }
}
}  // namespace

void gemm_nn(float* out, const float* A, const float* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm<float, false>(out, A, B, M, K, P, accumulate);
}
void gemm_nn(double* out, const double* A, const double* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm<double, false>(out, A, B, M, K, P, accumulate);
}
void gemm_tn(float* out, const float* At, const float* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm<float, true>(out, At, B, M, K, P, accumulate);
}
void gemm_tn(double* out, const double* At, const double* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm<double, true>(out, At, B, M, K, P, accumulate);
}

}  // namespace flashgpt::cpu::FLASHGPT_GEMM_NS
