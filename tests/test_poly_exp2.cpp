// The attention kernels' MUFU-free exp2 (kernels/cuda/attention/poly_exp2.h), on the CPU:
// the same function the kernels call, against std::exp2 in double.
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <string>
#include "kernels/cuda/attention/poly_exp2.h"

namespace flashgpt {
namespace {

using cuda::attn::poly_exp2;

double rel_err(float x) {
  const double want = std::exp2(double(x));
  return std::abs(double(poly_exp2(x)) - want) / want;
}

// Every fp32 value of [-1/2, 1/2] that the sweep meets, and the whole range the kernels
// use (scores minus their row's log-sum-exp: at most about 0, down to -126) at a step
// that is no power of two, so that the fractional parts cover [-1/2, 1/2] densely.
TEST(PolyExp2, RelativeErrorUnder3e6) {
  double worst = 0;
  float worst_at = 0;
  for (int k = -4'000'000; k <= 4'000'000; ++k) {
    const float x = float(k) / 8'000'000.f;
    if (rel_err(x) > worst) worst = rel_err(x), worst_at = x;
  }
  for (float x = -126.f; x <= 20.f; x += 0.0003173f)
    if (rel_err(x) > worst) worst = rel_err(x), worst_at = x;
  EXPECT_LT(worst, 3e-6) << "at x = " << worst_at;
  EXPECT_GT(worst, 1e-7) << "suspiciously exact: is this the polynomial?";
}

TEST(PolyExp2, IntegersAndHalvesAreExactOrClose) {
  for (int n = -126; n <= 30; ++n) {
    EXPECT_EQ(poly_exp2(float(n)), std::ldexp(1.f, n)) << "2^" << n << " (p(0) = 1 exactly)";
    EXPECT_LT(rel_err(float(n) + 0.5f), 3e-6) << n << " + 1/2";
    if (n > -126) EXPECT_LT(rel_err(float(n) - 0.5f), 3e-6) << n << " - 1/2";  // (2^-126.5: subnormal)
  }
}

TEST(PolyExp2, MaskedScoresGiveExactlyZero) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(poly_exp2(-inf), 0.f);
  EXPECT_EQ(poly_exp2(-1e30f), 0.f);
  EXPECT_EQ(poly_exp2(-127.f), 0.f);
  EXPECT_EQ(poly_exp2(std::numeric_limits<float>::quiet_NaN()), 0.f);
  EXPECT_FALSE(std::signbit(poly_exp2(-inf)));
}

// Below 2^-126 the result is only tiny: never negative, NaN or large (the exponent add
// must not wrap below zero when the polynomial is under 1).
TEST(PolyExp2, SubnormalRangeStaysTinyAndNonNegative) {
  for (float x = -127.f; x <= -125.f; x = std::nextafter(x, 0.f)) {
    const float y = poly_exp2(x);
    ASSERT_TRUE(std::isfinite(y)) << x;
    ASSERT_GE(y, 0.f) << x;
    ASSERT_LE(y, std::ldexp(1.f, -124)) << x;
  }
}

}  // namespace
}  // namespace flashgpt
