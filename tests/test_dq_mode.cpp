// The sm90 attention backward's dQ mode (kernels/cuda/attention/dq_mode.h), on the CPU:
// the GPU tests (Cuda/FlashAttentionVsReference) check that every mode computes the right
// gradients; these check which mode each request and shape gets. The GPU is an H200's
// (132 SMs, one backward block per SM).
#include <gtest/gtest.h>
#include <utility>
#include "kernels/cuda/attention/dq_mode.h"
#include "src/errors.h"

namespace flashgpt {
namespace {

using cuda::attn::choose_dq_mode;
using cuda::attn::backward_workspace_bytes;
using cuda::attn::choose_head_group;
using cuda::attn::dq_accum_floats;
using cuda::attn::DqMode;
using cuda::attn::stages_dk_dv;
constexpr int64_t kSms = 132;

constexpr bool kCausal = true, kFull = false;

TEST(DqMode, AutoTakesFlat) {
  // With the items in head groups, tma beat owner at every shape where owner used to be
  // auto's choice (causal masks whose pairs fill the last wave), and without a mask; flat
  // beat tma at D = 64, at D = 128 under a causal mask, and with dK and dV staged at
  // D = 128 without one.
  for (const char* v : {static_cast<const char*>(nullptr), "", "auto"}) EXPECT_EQ(choose_dq_mode(v), DqMode::flat);
}

TEST(DqMode, FlatStagesDkDvAtHeadDim64UpTo2KOr4KUnderACausalMask) {
  for (int T : {1, 1023, 1024, 2048}) {
    EXPECT_TRUE(stages_dk_dv(DqMode::flat, 64, T, kCausal)) << T;
    EXPECT_TRUE(stages_dk_dv(DqMode::flat, 64, T, kFull)) << T;
  }
  for (int T : {2049, 4096}) {
    EXPECT_TRUE(stages_dk_dv(DqMode::flat, 64, T, kCausal)) << T;
    EXPECT_FALSE(stages_dk_dv(DqMode::flat, 64, T, kFull)) << T;
  }
  for (int T : {4097, 4100, 8192, 65536}) {
    EXPECT_FALSE(stages_dk_dv(DqMode::flat, 64, T, kCausal)) << T;
    EXPECT_FALSE(stages_dk_dv(DqMode::flat, 64, T, kFull)) << T;
  }
  // The other modes at D = 64 have no staged kernel.
  for (DqMode mode : {DqMode::tma, DqMode::atomic, DqMode::owner})
    for (bool causal : {kCausal, kFull}) EXPECT_FALSE(stages_dk_dv(mode, 64, 1024, causal));
}

TEST(DqMode, TmaAndFlatStageDkDvAtHeadDim128WithoutAMaskOrUpTo4KUnderOne) {
  for (DqMode mode : {DqMode::tma, DqMode::flat}) {
    for (int T : {1, 1024, 4096, 4100, 16384, 65536}) EXPECT_TRUE(stages_dk_dv(mode, 128, T, kFull)) << T;
    for (int T : {1, 1023, 2048, 4096}) EXPECT_TRUE(stages_dk_dv(mode, 128, T, kCausal)) << T;
    for (int T : {4097, 4100, 8192, 65536}) EXPECT_FALSE(stages_dk_dv(mode, 128, T, kCausal)) << T;
  }
  for (DqMode mode : {DqMode::atomic, DqMode::owner})
    for (bool causal : {kCausal, kFull}) EXPECT_FALSE(stages_dk_dv(mode, 128, 1024, causal));
}

TEST(DqMode, ARequestedModeIsTaken) {
  EXPECT_EQ(choose_dq_mode("atomic"), DqMode::atomic);
  EXPECT_EQ(choose_dq_mode("tma"), DqMode::tma);
  EXPECT_EQ(choose_dq_mode("owner"), DqMode::owner);
  EXPECT_EQ(choose_dq_mode("flat"), DqMode::flat);
}

// The workspace: the (B, H, T, D) fp32 accumulator with T in whole 128-row tiles, then 16
// bytes for the work counter; flat mode's accumulator (whole tiles of BM rows: 128 at
// D = 64, 64 or, without a mask, 80 at D = 128) fits in it at every T.
TEST(DqMode, TheWorkspaceHoldsWholeQueryTilesAndTheCounter) {
  EXPECT_EQ(dq_accum_floats(2, 1, 3, 64), 2 * 3 * 128 * 64);
  EXPECT_EQ(dq_accum_floats(1, 128, 1, 128), 160 * 128);  // two 80-row tiles
  EXPECT_EQ(dq_accum_floats(1, 129, 1, 64), 256 * 64);
  EXPECT_EQ(backward_workspace_bytes(1, 129, 2, 64), 2 * 256 * 64 * 4 + 16);
  EXPECT_EQ(dq_accum_floats(1, 1024, 1, 128), 1040 * 128);  // 13 tiles of 80 rows
  EXPECT_EQ(dq_accum_floats(1, 1024, 1, 64), 1024 * 64);
  for (int64_t T : {1, 17, 63, 64, 65, 79, 81, 127, 128, 129, 1023, 1024, 4100, 65537})
    for (auto [D, BM] : {std::pair<int64_t, int64_t>{64, 128}, {128, 64}, {128, 80}}) {
      const int64_t B = 2, H = 3, flat = B * H * ((T + BM - 1) / BM) * BM * D;
      EXPECT_LE(flat, dq_accum_floats(B, T, H, D)) << "T=" << T << " D=" << D;
      EXPECT_GE(dq_accum_floats(B, T, H, D), B * H * T * D);
    }
}

TEST(DqMode, AnUnknownRequestIsAnInputError) {
  for (const char* bad : {"owners", "TMA", "atomics", " auto", "flats"})
    EXPECT_THROW(choose_dq_mode(bad), InputError) << bad;
}

// auto's group (the variable unset) for `pairs` pairs of T rows on `sms` SMs.
int64_t auto_group(int64_t pairs, int64_t T, int64_t sms = kSms) { return choose_head_group(nullptr, pairs, T, sms); }

TEST(HeadGroup, AutoTakesTheGroupWhoseKeyTilesFillOneWave) {
  // 132 SMs / key tiles of 128 keys a pair, rounded down to a power of two.
  EXPECT_EQ(auto_group(256, 1024), 16);  // 8 tiles: 16.5
  EXPECT_EQ(auto_group(768, 1024), 16);  // GPT-2 124M, B = 64, H = 12
  EXPECT_EQ(auto_group(128, 2048), 8);
  EXPECT_EQ(auto_group(64, 4096), 4);
  EXPECT_EQ(auto_group(32, 8192), 2);
  EXPECT_EQ(auto_group(16, 16384), 1);   // 128 tiles
  EXPECT_EQ(auto_group(16, 65536), 1);   // more tiles than SMs: still one pair
  EXPECT_EQ(choose_head_group("auto", 256, 1024, kSms), 16);
  EXPECT_EQ(choose_head_group("", 128, 2048, kSms), 8);
}

TEST(HeadGroup, PartialKeyTilesCount) {
  // 1000 keys are 8 tiles (16.5 pairs: 16); 1025 are 9 (14.7: 8); 129 are 2 (66: 64).
  EXPECT_EQ(auto_group(256, 1000), 16);
  EXPECT_EQ(auto_group(256, 1025), 8);
  EXPECT_EQ(auto_group(256, 129), 64);
  EXPECT_EQ(auto_group(256, 128), 128);
}

TEST(HeadGroup, BelowEveryPairTheGroupIsAPowerOfTwo) {
  // 108 SMs (an A100): 13.5 pairs at 1K, so 8; 78 SMs at 2K: 4.9, so 4; 96 at 1K: 12, so 8.
  EXPECT_EQ(auto_group(256, 1024, 108), 8);
  EXPECT_EQ(auto_group(256, 2048, 78), 4);
  EXPECT_EQ(auto_group(256, 1024, 96), 8);
  // Every pair is taken as it is, a power of two or not.
  EXPECT_EQ(auto_group(6, 1024), 6);
  EXPECT_EQ(auto_group(12, 1024), 12);
  EXPECT_EQ(auto_group(16, 1024), 16);
  // Fewer SMs than key tiles a pair: one pair.
  EXPECT_EQ(auto_group(256, 1024, 6), 1);
}

TEST(HeadGroup, ARequestIsTakenUpToEveryPair) {
  EXPECT_EQ(choose_head_group("all", 32, 16384, kSms), 32);
  EXPECT_EQ(choose_head_group("1", 32, 16384, kSms), 1);
  EXPECT_EQ(choose_head_group("3", 32, 16384, kSms), 3);
  EXPECT_EQ(choose_head_group("100", 32, 16384, kSms), 32);
  for (const char* bad : {"0", "-2", "+2", " 2", "2x", "ALL", "four", "1e3"})
    EXPECT_THROW(choose_head_group(bad, 32, 16384, kSms), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
