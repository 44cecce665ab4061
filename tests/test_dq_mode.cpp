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
using cuda::attn::choose_head_group;
using cuda::attn::DqMode;
constexpr int64_t kSms = 132;

constexpr bool kCausal = true, kFull = false;

TEST(DqMode, AutoTakesOwnerWhenCausalHeadsFillTheLastWave) {
  // GPT-2 124M's training step, B = 64: 768 (batch, head) pairs = 5.8 waves (97%).
  EXPECT_EQ(choose_dq_mode(nullptr, 64, 12, kCausal, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode("", 64, 12, kCausal, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode("auto", 64, 12, kCausal, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 8, 32, kCausal, kSms), DqMode::owner);   // 256 pairs: 97%
  EXPECT_EQ(choose_dq_mode(nullptr, 16, 12, kCausal, kSms), DqMode::tma);    // 192: 73%
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 12, kCausal, kSms), DqMode::tma);     // one long sequence: 9%
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 32, kCausal, kSms), DqMode::tma);     // 24%
  // The threshold itself (90%) is owner; one pair fewer is not.
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 9, kCausal, 10), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 8, kCausal, 10), DqMode::tma);
  EXPECT_EQ(choose_dq_mode(nullptr, 2, 9, kCausal, 10), DqMode::owner);      // 18 of 20
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 17, kCausal, 10), DqMode::tma);       // 17 of 20
}

TEST(DqMode, AutoTakesOwnerAtDim128ByTheSameRule) {
  // The sweep's causal D = 128 shapes (H = 16): T = 1K and 2K at B = 16 and 8 fill the
  // last wave to 97%, where owner beat tma; from 4K (B <= 4: 64 pairs and fewer) tma.
  EXPECT_EQ(choose_dq_mode(nullptr, 16, 16, kCausal, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 8, 16, kCausal, kSms), DqMode::owner);
  EXPECT_EQ(choose_dq_mode(nullptr, 4, 16, kCausal, kSms), DqMode::tma);
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 16, kCausal, kSms), DqMode::tma);
}

TEST(DqMode, AutoTakesTmaWithoutAMaskWhateverTheWaveFill) {
  // Without a mask tma beat owner at every shape where the rule above picks owner.
  for (int64_t B : {64, 16, 8, 4, 1}) {
    EXPECT_EQ(choose_dq_mode(nullptr, B, 12, kFull, kSms), DqMode::tma) << B;
    EXPECT_EQ(choose_dq_mode(nullptr, B, 32, kFull, kSms), DqMode::tma) << B;
    EXPECT_EQ(choose_dq_mode("auto", B, 16, kFull, kSms), DqMode::tma) << B;
  }
  EXPECT_EQ(choose_dq_mode(nullptr, 1, 9, kFull, 10), DqMode::tma);  // a full last wave too
}

TEST(DqMode, ARequestedModeIsTaken) {
  for (int64_t B : {1, 64}) {
    for (bool causal : {kCausal, kFull}) {
      EXPECT_EQ(choose_dq_mode("atomic", B, 12, causal, kSms), DqMode::atomic) << B;
      EXPECT_EQ(choose_dq_mode("tma", B, 12, causal, kSms), DqMode::tma) << B;
      EXPECT_EQ(choose_dq_mode("owner", B, 12, causal, kSms), DqMode::owner) << B;
    }
  }
}

TEST(DqMode, AnUnknownRequestIsAnInputError) {
  for (const char* bad : {"owners", "TMA", "atomics", " auto"})
    EXPECT_THROW(choose_dq_mode(bad, 64, 12, kCausal, kSms), InputError) << bad;
}

constexpr int64_t kL2 = 50 << 20;  // an H200's L2: 50 MiB

TEST(HeadGroup, FullMasksFitTheGroupsRowsInTwoThirdsOfTheL2) {
  // T·D·8 bytes a pair: 8 MiB at D = 64, T = 16K; 2/3 of the L2 is 33.3 MiB.
  EXPECT_EQ(choose_head_group(nullptr, 32, 16384, 64, /*causal=*/false, kL2), 4);
  EXPECT_EQ(choose_head_group("auto", 32, 16384, 64, /*causal=*/false, kL2), 4);
  EXPECT_EQ(choose_head_group("", 32, 8192, 128, /*causal=*/false, kL2), 4);
  EXPECT_EQ(choose_head_group(nullptr, 64, 4096, 128, /*causal=*/false, kL2), 8);
  // At least one pair, however long the sequence; at most every pair.
  EXPECT_EQ(choose_head_group(nullptr, 12, 1 << 20, 128, /*causal=*/false, kL2), 1);
  EXPECT_EQ(choose_head_group(nullptr, 3, 1024, 64, /*causal=*/false, kL2), 3);
  // The budget's edge: 4 pairs of 8 MiB fit in 32 MiB, 5 do not; a larger L2 takes more.
  EXPECT_EQ(choose_head_group(nullptr, 64, 16384, 64, /*causal=*/false, 48 << 20), 4);
  EXPECT_EQ(choose_head_group(nullptr, 64, 16384, 64, /*causal=*/false, 60 << 20), 5);
}

TEST(HeadGroup, CausalMasksGroupOnlyPairsThatFillHalfTheL2AtDim64) {
  // Key tile major (every pair) up to T = 51,199 at D = 64 (a pair's rows under 25 MiB)...
  EXPECT_EQ(choose_head_group(nullptr, 32, 16384, 64, /*causal=*/true, kL2), 32);
  EXPECT_EQ(choose_head_group(nullptr, 64, 8192, 64, /*causal=*/true, kL2), 64);
  EXPECT_EQ(choose_head_group(nullptr, 12, 51199, 64, /*causal=*/true, kL2), 12);
  // ...then groups within 4/3 of the L2 (66.7 MiB): 2 pairs of 25 or 32 MiB, then 1.
  EXPECT_EQ(choose_head_group(nullptr, 12, 51200, 64, /*causal=*/true, kL2), 2);
  EXPECT_EQ(choose_head_group(nullptr, 12, 65536, 64, /*causal=*/true, kL2), 2);
  EXPECT_EQ(choose_head_group(nullptr, 12, 1 << 20, 64, /*causal=*/true, kL2), 1);
  // D = 128: every pair, however long.
  EXPECT_EQ(choose_head_group(nullptr, 16, 16384, 128, /*causal=*/true, kL2), 16);
  EXPECT_EQ(choose_head_group(nullptr, 12, 1 << 20, 128, /*causal=*/true, kL2), 12);
}

TEST(HeadGroup, ARequestIsTakenUpToEveryPair) {
  EXPECT_EQ(choose_head_group("all", 32, 16384, 64, true, kL2), 32);
  EXPECT_EQ(choose_head_group("1", 32, 16384, 64, true, kL2), 1);
  EXPECT_EQ(choose_head_group("3", 32, 16384, 128, true, kL2), 3);
  EXPECT_EQ(choose_head_group("100", 32, 16384, 64, false, kL2), 32);
  for (const char* bad : {"0", "-2", "+2", " 2", "2x", "ALL", "four", "1e3"})
    EXPECT_THROW(choose_head_group(bad, 32, 16384, 64, true, kL2), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
