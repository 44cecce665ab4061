// The choice rule of the in-place GEMM tuning (kernels/cuda/gemm_tuning.h), on the CPU:
// the GPU tests (CudaOps.MatmulTuning*) check that tuning settles and that every
// candidate computes the right product; these check which candidate it settles on.
#include <gtest/gtest.h>
#include <vector>
#include "kernels/cuda/gemm_tuning.h"

namespace flashgpt {
namespace {

using cuda::fastest_candidate;
using Timings = std::vector<std::vector<float>>;

TEST(GemmTuning, WaitsUntilEveryCandidateHasItsRuns) {
  EXPECT_EQ(fastest_candidate({}, 2), -1);
  EXPECT_EQ(fastest_candidate({{5.f, 1.f, 1.f}, {5.f, 2.f}}, 2), -1);  // candidate 1 has 1 + 1
  EXPECT_EQ(fastest_candidate({{5.f, 1.f, 1.f}, {5.f, 2.f, 2.f}}, 2), 0);
  EXPECT_EQ(fastest_candidate({{5.f, 3.f, 3.f, 3.f}, {5.f, 2.f, 2.f}}, 2), 1);  // more runs than asked: all count
}

TEST(GemmTuning, TheFirstRunDoesNotCount) {
  // Without their first runs: medians 2.0 and 1.5, so candidate 1. Counted, the first
  // runs would make them 1.0 and 1.5, and candidate 0 would win.
  EXPECT_EQ(fastest_candidate({{0.1f, 1.f, 3.f}, {5.f, 1.5f, 1.5f}}, 2), 1);
}

TEST(GemmTuning, LowestMedianWins) {
  // Odd counts: the middle value, so one slow outlier does not cost candidate 0 the win.
  EXPECT_EQ(fastest_candidate({{0.f, 1.f, 1.f, 9.f}, {0.f, 1.5f, 1.5f, 1.5f}}, 3), 0);
  // Even counts: the mean of the two middle values (1.5 against 1.6).
  EXPECT_EQ(fastest_candidate({{0.f, 1.f, 2.f}, {0.f, 1.6f, 1.6f}}, 2), 0);
  EXPECT_EQ(fastest_candidate({{0.f, 1.f, 2.4f}, {0.f, 1.6f, 1.6f}}, 2), 1);
}

TEST(GemmTuning, TiesGoToTheHeuristicsEarlierCandidate) {
  EXPECT_EQ(fastest_candidate({{0.f, 2.f, 2.f}, {0.f, 1.f, 1.f}, {0.f, 1.f, 1.f}}, 2), 1);
}

}  // namespace
}  // namespace flashgpt
