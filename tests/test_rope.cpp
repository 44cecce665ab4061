// Rotary position embedding on the CPU (Ops::rope, kernels/cpu/layers.cpp) and the
// embedding without a position table: the backward (inverse rotation) against central
// finite differences in fp64 on awkward shapes, the formula at known positions, the
// relative-position property that is the point of RoPE, v left alone, and the rows of a
// decode step (positions from pos0) equal to the same rows of the whole sequence.
#include <gtest/gtest.h>
#include <cmath>
#include "kernels/ops.h"
#include "testing.h"

namespace flashgpt {
namespace {

using test::expect_all_close;
using test::expect_gradient_matches;
using test::fill_ints;
using test::fill_uniform;
using test::HostTensor;
using test::RandomProjection;
using test::test_rng;
using H64 = HostTensor<double>;

class CpuRope : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops();
};

struct Shape { int B, T, H, D; };
constexpr Shape kShapes[] = {{2, 7, 3, 4}, {1, 33, 2, 16}, {3, 1, 1, 2}, {2, 5, 2, 64}};

TEST_F(CpuRope, BackwardIsTheInverseRotationAndMatchesFiniteDifferences) {
  for (Shape s : kShapes) {
    SCOPED_TRACE(cat("B=", s.B, " T=", s.T, " H=", s.H, " D=", s.D));
    auto rng = test_rng(s.T * 131 + s.D);
    const int64_t N = int64_t(s.B) * s.T, W = 3 * int64_t(s.H) * s.D;
    H64 x({N, W}), y({N, W});
    fill_uniform(x, rng);
    RandomProjection loss_of(y.numel(), rng);
    auto loss = [&] {
      y.vec() = x.vec();
      ops->rope(y, s.T, s.H, /*inverse=*/false, /*pos0=*/0);
      return loss_of(y);
    };
    H64 dx({N, W});
    dx.vec() = loss_of.weights().vec();  // dL/dy, rotated back in place into dL/dx
    ops->rope(dx, s.T, s.H, /*inverse=*/true, /*pos0=*/0);
    expect_gradient_matches("d qkv", dx.vec(), x, loss);
  }
}

TEST_F(CpuRope, RotatesPairsByPositionTimesFrequency) {
  const int B = 2, T = 9, H = 2, D = 8, half = D / 2;
  auto rng = test_rng();
  H64 x({B * T, 3 * H * D});
  fill_uniform(x, rng);
  H64 y = x;
  ops->rope(y, T, H, /*inverse=*/false, /*pos0=*/0);
  for (int n = 0; n < B * T; ++n)
    for (int part = 0; part < 3; ++part)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < half; ++i) {
          const int64_t base = int64_t(n) * 3 * H * D + (part * H + h) * D;
          const double a = x[base + i], b = x[base + i + half];
          const double ang = (n % T) * std::pow(10000.0, -2.0 * i / D);
          // v (part 2) is never rotated; position 0 is the identity.
          const double c = part == 2 ? 1 : std::cos(ang), sn = part == 2 ? 0 : std::sin(ang);
          EXPECT_NEAR(y[base + i], a * c - b * sn, 1e-15) << n << " " << part << " " << h << " " << i;
          EXPECT_NEAR(y[base + i + half], b * c + a * sn, 1e-15) << n << " " << part << " " << h << " " << i;
        }
}

// q·k after rotation depends on the positions only through their difference, also at
// positions near a million, where an fp32 angle would be ~0.03 rad off. (Far positions
// with head dim 2: one pair at θ = 1, the fastest rotation, and rows of 6 doubles.)
TEST_F(CpuRope, ScoresDependOnlyOnRelativePosition) {
  auto score = [&](int64_t tq, int64_t tk, int D) {
    std::mt19937_64 same(7);  // the same q and k for every call of one D
    std::uniform_real_distribution<double> u(-1, 1);
    // One row per position; the rows other than tq, tk stay zero and are not read.
    const int64_t T = std::max(tq, tk) + 1;
    H64 x({T, 3 * D});
    for (int d = 0; d < D; ++d) x[tq * 3 * D + d] = u(same);
    for (int d = 0; d < D; ++d) x[tk * 3 * D + D + d] = u(same);
    ops->rope(x, int(T), /*H=*/1, /*inverse=*/false, /*pos0=*/0);
    double s = 0;
    for (int d = 0; d < D; ++d) s += x[tq * 3 * D + d] * x[tk * 3 * D + D + d];
    return s;
  };
  EXPECT_NEAR(score(7, 3, 64), score(40, 36, 64), 1e-13);
  EXPECT_GT(std::fabs(score(7, 3, 64) - score(7, 4, 64)), 1e-6);  // and it does depend on it
  // fp64 angles: t·θ near 10^6 is off by ~1e-10 rad, so the score by about as much.
  EXPECT_NEAR(score(7, 3, 2), score(1000004, 1000000, 2), 1e-9);
}

// A decode step rotates its rows by positions pos0 + t (the KV cache before them): the
// same bits as those rows rotated within the whole sequence, for B sequences at once, and
// its inverse undoes it.
TEST_F(CpuRope, RowsFromAnOffsetMatchTheWholeSequence) {
  const int B = 3, T = 29, H = 2, D = 16, W = 3 * H * D;
  auto rng = test_rng();
  H64 whole({B * T, W});
  fill_uniform(whole, rng);
  H64 rotated = whole;
  ops->rope(rotated, T, H, /*inverse=*/false, /*pos0=*/0);
  for (int pos0 : {0, 1, 17, 28})
    for (int n = 1; pos0 + n <= T; n += 5) {
      SCOPED_TRACE(cat("pos0=", pos0, " n=", n));
      H64 step({B * n, W});  // rows (b, t) of this step, t < n
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < n; ++t)
          for (int i = 0; i < W; ++i) step[(b * n + t) * W + i] = whole[(b * T + pos0 + t) * W + i];
      H64 back = step;
      ops->rope(step, n, H, /*inverse=*/false, pos0);
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < n; ++t)
          for (int i = 0; i < W; ++i)
            ASSERT_EQ(step[(b * n + t) * W + i], rotated[(b * T + pos0 + t) * W + i]) << b << " " << t << " " << i;
      ops->rope(step, n, H, /*inverse=*/true, pos0);
      expect_all_close(step.vec(), back.vec(), 1e-14, 1e-14, "the inverse rotation");
    }
}

TEST_F(CpuRope, EmbeddingWithoutPositionTable) {
  const int64_t V = 11, C = 12, B = 2, T = 5;
  auto rng = test_rng();
  HostTensor<int32_t> tokens({B, T});
  fill_ints(tokens, rng, 0, int32_t(V));
  H64 wte({V, C}), out({B, T, C});
  fill_uniform(wte, rng);
  ops->embedding_forward(out, tokens, wte, Tensor());
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[n * C + c], wte[tokens[n] * C + c]);
  RandomProjection loss_of(out.numel(), rng);
  auto loss = [&] {
    ops->embedding_forward(out, tokens, wte, Tensor());
    return loss_of(out);
  };
  H64 dwte({V, C});
  ops->embedding_backward(dwte, Tensor(), loss_of.weights(), tokens);
  expect_gradient_matches("dwte", dwte.vec(), wte, loss);
}

}  // namespace
}  // namespace flashgpt
