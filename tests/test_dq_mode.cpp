// The sm90 attention backward's dQ mode (kernels/cuda/attention/dq_mode.h), on the CPU:
// the GPU tests (Cuda/FlashAttentionVsReference) check that every mode computes the right
// gradients; these check which mode each request and shape gets. The GPU is an H200's
// (132 SMs, one backward block per SM).
#include <gtest/gtest.h>
#include "kernels/cuda/attention/dq_mode.h"
#include "src/errors.h"

namespace flashgpt {
namespace {

using cuda::attn::choose_dq_mode;
using cuda::attn::DqMode;
constexpr int64_t kSms = 132;

TEST(DqMode, AutoTakesOwnerWhenTheHeadsFillTheLastWave) {
  // GPT-2 124M's training step, B = 64: 768 (batch, head) pairs = 5.8 waves (97%).
  EXPECT_EQ(choose_dq_mode(nullptr, 64, 12, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode("", 64, 12, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode("auto", 64, 12, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 8, 32, kSms), DqMode::owner);   // 256 pairs: 97%
  EXPECT_EQ(choose_dq_mode(nullptr, 16, 12, kSms), DqMode::tma);    // 192: 73%
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 12, kSms), DqMode::tma);     // one long sequence: 9%
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 32, kSms), DqMode::tma);     // 24%
  // The threshold itself (90%) is owner; one pair fewer is not.
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 9, 10), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 8, 10), DqMode::tma);
  EXPECT_EQ(choose_dq_mode(nullptr, 2, 9, 10), DqMode::owner);      // 18 of 20
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 17, 10), DqMode::tma);       // 17 of 20
}

TEST(DqMode, AutoTakesOwnerAtDim128ByTheSameRule) {
  // The sweep's D = 128 shapes (H = 16): T = 1K and 2K at B = 16 and 8 fill the last
  // wave to 97%, where owner beat tma; from 4K (B <= 4: 64 pairs and fewer) tma.
  EXPECT_EQ(choose_dq_mode(nullptr, 16, 16, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 8, 16, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 4, 16, kSms), DqMode::tma);
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 16, kSms), DqMode::tma);
}

TEST(DqMode, ARequestedModeIsTaken) {
  for (int64_t B : {1, 64}) {
    EXPECT_EQ(choose_dq_mode("atomic", B, 12, kSms), DqMode::atomic) << B;
    EXPECT_EQ(choose_dq_mode("tma", B, 12, kSms), DqMode::tma) << B;
    EXPECT_EQ(choose_dq_mode("owner", B, 12, kSms), DqMode::owner) << B;
  }
}

TEST(DqMode, AnUnknownRequestIsAnInputError) {
  for (const char* bad : {"owners", "TMA", "atomics", " auto"})
    EXPECT_THROW(choose_dq_mode(bad, 64, 12, kSms), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
