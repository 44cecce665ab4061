// softmax_ce.h's row kernel, compiled once per x86-64 level (level_namespace.h). Its sum
// runs over kCeLanes independent lanes, which the compiler maps onto 2, 4 or 8 doubles a
// vector without reordering any sum; exp_nonpositive is plain arithmetic without a branch,
// so its loop vectorises at every level (glibc's exp, a call per logit, was about a quarter
// of the tiny model's CPU step: BENCHMARKS.md, "Forty-ninth session"). The loops marked
// [vectorised] must vectorise at every level: tests/scripts/cpu_vectorised.sh asks GCC.
#include <cmath>
#include <cstring>
#include "kernels/cpu/level_namespace.h"
#include "kernels/cpu/softmax_ce.h"

namespace flashgpt::cpu::FLASHGPT_GEMM_NS {

namespace {

// e^x for x <= 0 (a logit minus the row's max): x = n·ln 2 + r with |r| <= ln 2 / 2
// (Cody and Waite's two-part ln 2, so n·ln2_hi is exact), e^r by its Taylor series to
// r^13 (truncation under 4e-18 relative), times 2^n set in the exponent bits. Below
// −708 (where 2^n would leave the normal range) it returns 0: such a term is under
// 1e-307 of the row's sum, which holds the max's e^0 = 1. Within 2 ulp of e^x
// (CpuOps.ExpNonpositiveIsWithinTwoUlp), exactly 1 at 0; NaN stays NaN.
inline double exp_nonpositive(double x) {
  constexpr double kLog2e = 1.4426950408889634, kShift = 0x1.8p52;
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double t = x * kLog2e + kShift;  // n in t's low mantissa bits
  const double n = t - kShift;
  const double r = (x - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.6059043836821613e-10;  // 1/13!
  p = p * r + 2.08767569878681e-09;
  p = p * r + 2.505210838544172e-08;
  p = p * r + 2.755731922398589e-07;
  p = p * r + 2.7557319223985893e-06;
  p = p * r + 2.48015873015873e-05;
  p = p * r + 0.0001984126984126984;
  p = p * r + 0.001388888888888889;
  p = p * r + 0.008333333333333333;
  p = p * r + 0.041666666666666664;
  p = p * r + 0.16666666666666666;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n: t's bits minus kShift's are n (the same binade), plus the exponent bias, shifted
  // into the exponent field; unsigned, so that the n of an x below −708 (discarded below)
  // wraps instead of overflowing.
  uint64_t tb;
  std::memcpy(&tb, &t, sizeof tb);
  const uint64_t scale_bits = (tb - 0x4338000000000000u + 1023u) << 52;
  double scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  // p·2^n, or +0 below −708, by a bit mask (NaN fails the test and stays NaN). GCC keeps
  // `x < -708.0 ? 0.0 : p * scale` as a branch below AVX-512 (a comparison may trap), so
  // that loop did not vectorise at levels 2 and 3: 3.3 times slower at level 3.
  const double v = p * scale;
  const uint64_t keep = uint64_t(0) - uint64_t(!(x < -708.0));
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= keep;
  double out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

template <class T>
double row_kernel(T* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e) {
  constexpr int L = kCeLanes;
  // The max, in any order (a max is exact; the order can only pick the sign of a zero max,
  // which changes no difference below, or which NaN, when the loss is NaN anyway).
  T m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) m = row[j] > m ? row[j] : m;  // [vectorised]
  const double max = double(m);
  // The exponentials, kept for the gradient (a flat loop, as wide as the level's vectors),
  // then their sum in fixed lanes.
  for (int64_t j = 0; j < V; ++j) e[j] = exp_nonpositive(double(row[j]) - max);  // [vectorised]
  double lane_sum[L] = {};
  int64_t j = 0;
  for (; j + L <= V; j += L)  // [vectorised]
    for (int l = 0; l < L; ++l) lane_sum[l] += e[j + l];
  double sum = 0;
  for (int l = 0; l < L; ++l) sum += lane_sum[l];
  for (; j < V; ++j) sum += e[j];
  const double loss = max + std::log(sum) - double(row[target]);
  if (dloss == 0) return loss;
  const double inv_sum = 1.0 / sum, d = double(dloss);
  for (j = 0; j < V; ++j) row[j] = T(d * (e[j] * inv_sum));  // [vectorised]
  row[target] = T(d * (e[target] * inv_sum - 1.0));
  for (j = V; j < Vp; ++j) row[j] = T(0);
  return loss;
}

}  // namespace

double ce_row(float* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e) {
  return row_kernel(row, V, Vp, target, dloss, e);
}
double ce_row(double* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e) {
  return row_kernel(row, V, Vp, target, dloss, e);
}
double exp_nonpositive_at_level(double x) { return exp_nonpositive(x); }

}  // namespace flashgpt::cpu::FLASHGPT_GEMM_NS
