// The CPU matmul's one kernel (matmul.cpp says how each product uses it):
//   out (M,P) = (accumulate ? out : 0) + A (M,K) · B (K,P), all row-major,
// each output element summed in k order, whatever the thread count; gemm_tn takes A as
// its transpose At (K,M), row-major, and sums the same products in the same order.
// gemm_kernel.cpp is compiled once per x86-64 level, into namespaces v2 (SSE4.2), v3
// (AVX2) and v4 (AVX-512), without fused multiply-adds (-ffp-contract=off), so every
// level computes the same bits; gemm_nn runs the highest level this CPU has.
#pragma once
#include <cstdint>

namespace flashgpt::cpu {

#define FLASHGPT_GEMM_DECLS                                                                                      \
  void gemm_nn(float* out, const float* A, const float* B, int64_t M, int64_t K, int64_t P, bool accumulate);     \
  void gemm_nn(double* out, const double* A, const double* B, int64_t M, int64_t K, int64_t P, bool accumulate);  \
  void gemm_tn(float* out, const float* At, const float* B, int64_t M, int64_t K, int64_t P, bool accumulate);    \
  void gemm_tn(double* out, const double* At, const double* B, int64_t M, int64_t K, int64_t P, bool accumulate);
namespace v2 { FLASHGPT_GEMM_DECLS }
namespace v3 { FLASHGPT_GEMM_DECLS }
namespace v4 { FLASHGPT_GEMM_DECLS }
#undef FLASHGPT_GEMM_DECLS

// The highest x86-64 level this CPU runs (2, 3 or 4): the level of the per-level kernels
// (these and softmax_ce.h's).
int gemm_level();
// A requested level's index into {v2, v3, v4} tables of kernels (level 2..gemm_level(),
// asserted).
int level_index(int level);
// The kernel at `level` (2..gemm_level(); tests compare the levels); gemm_nn, gemm_tn: at
// gemm_level().
template <class T>
void gemm_nn_at(int level, T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate);
template <class T>
void gemm_tn_at(int level, T* out, const T* At, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate);
template <class T>
void gemm_nn(T* out, const T* A, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm_nn_at(gemm_level(), out, A, B, M, K, P, accumulate);
}
template <class T>
void gemm_tn(T* out, const T* At, const T* B, int64_t M, int64_t K, int64_t P, bool accumulate) {
  gemm_tn_at(gemm_level(), out, At, B, M, K, P, accumulate);
}

}  // namespace flashgpt::cpu
