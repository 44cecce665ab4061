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

constexpr int64_t kL2 = 50 << 20;  // an H200's L2: 50 MiB (an H100's too)
constexpr double kH200Dram = 4.8e12, kH100Dram = 3.35e12;  // peak DRAM bytes/s

// auto's group (the variable unset) for `pairs` pairs of T rows at head dim D.
// Claimed an item ahead (D = 64; atomic mode at D = 128): auto_group; just in time (D = 128,
// tma and flat modes): jit_group.
int64_t auto_group(int64_t pairs, int64_t T, int64_t D, bool causal, int64_t l2 = kL2, int64_t sms = kSms,
                   double dram = kH200Dram) {
  return choose_head_group(nullptr, pairs, T, D, causal, l2, sms, dram, /*just_in_time=*/false);
}
int64_t jit_group(int64_t pairs, int64_t T, bool causal, int64_t sms = kSms, double dram = kH200Dram) {
  return choose_head_group(nullptr, pairs, T, 128, causal, kL2, sms, dram, /*just_in_time=*/true);
}

// T·D·8 bytes a pair (Q, dO, the fp32 dQ): 0.5 MiB at D = 64, T = 1K; 8 MiB at T = 16K.
TEST(HeadGroup, FullMasksFitTheGroupsRowsInTwoThirdsOfTheL2) {
  // 2/3 of the L2 is 33.3 MiB: 4 pairs of 8 MiB, 8 of 4 MiB.
  EXPECT_EQ(auto_group(32, 16384, 64, kFull), 4);
  EXPECT_EQ(choose_head_group("auto", 32, 16384, 64, kFull, kL2, kSms, kH200Dram, false), 4);
  EXPECT_EQ(choose_head_group("", 32, 8192, 128, kFull, kL2, kSms, kH200Dram, false), 4);
  EXPECT_EQ(auto_group(64, 4096, 128, kFull), 8);
  // At least one pair, however long the sequence; at most every pair.
  EXPECT_EQ(auto_group(12, 1 << 20, 128, kFull), 1);
  EXPECT_EQ(auto_group(3, 1024, 64, kFull), 3);
}

TEST(HeadGroup, FullMasksTakeAtMostAQuarterOfTheSms) {
  // 16 x 32 x 1K, D = 64: 66 pairs fit the budget; 132 / 4 = 33, and a power of two: 32.
  EXPECT_EQ(auto_group(512, 1024, 64, kFull), 32);
  EXPECT_EQ(auto_group(256, 1024, 128, kFull), 32);
  // An A100's 108 SMs and 40 MiB: 27, so 16.
  EXPECT_EQ(auto_group(512, 1024, 64, kFull, 40 << 20, 108), 16);
}

TEST(HeadGroup, BelowEveryPairTheGroupIsAPowerOfTwo) {
  // 8 MiB pairs: 40 MiB (L2 60 MiB) holds 5, 53.3 MiB (80) 6, 64 MiB (96) 8.
  EXPECT_EQ(auto_group(64, 16384, 64, kFull, 60 << 20), 4);
  EXPECT_EQ(auto_group(64, 16384, 64, kFull, 80 << 20), 4);
  EXPECT_EQ(auto_group(64, 16384, 64, kFull, 96 << 20), 8);
  // Every pair is taken as it is, a power of two or not.
  EXPECT_EQ(auto_group(6, 16384, 64, kFull, 96 << 20), 6);
  EXPECT_EQ(auto_group(48, 1024, 64, kCausal), 48);
}

TEST(HeadGroup, CausalDim64FitsTwiceTheL2AndHalfTheSms) {
  // Twice the L2 is 100 MiB; 132 / 2 = 66.
  EXPECT_EQ(auto_group(768, 1024, 64, kCausal), 64);  // GPT-2 124M, B = 64
  EXPECT_EQ(auto_group(512, 1024, 64, kCausal), 64);
  EXPECT_EQ(auto_group(256, 2048, 64, kCausal), 64);
  EXPECT_EQ(auto_group(128, 4096, 64, kCausal), 32);
  EXPECT_EQ(auto_group(64, 8192, 64, kCausal), 16);
  EXPECT_EQ(auto_group(32, 16384, 64, kCausal), 8);
  EXPECT_EQ(auto_group(12, 16384, 64, kCausal), 12);  // 96 MiB: every pair
  EXPECT_EQ(auto_group(13, 16384, 64, kCausal), 8);   // 104 MiB
  EXPECT_EQ(auto_group(12, 32768, 64, kCausal), 4);   // 6 of 16 MiB, so 4
  EXPECT_EQ(auto_group(12, 65536, 64, kCausal), 2);
  EXPECT_EQ(auto_group(12, 1 << 20, 64, kCausal), 1);
  EXPECT_EQ(auto_group(12, 1024, 64, kCausal), 12);
}

TEST(HeadGroup, CausalDim128FitsFourTimesTheL2AndAQuarterOfTheSms) {
  // Four times the L2 is 200 MiB; 132 / 4 = 33.
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal), 32);
  EXPECT_EQ(auto_group(128, 2048, 128, kCausal), 32);
  EXPECT_EQ(auto_group(64, 4096, 128, kCausal), 32);
  EXPECT_EQ(auto_group(32, 8192, 128, kCausal), 16);   // 25 of 8 MiB
  EXPECT_EQ(auto_group(16, 16384, 128, kCausal), 8);   // 12.5 of 16 MiB
  EXPECT_EQ(auto_group(12, 16384, 128, kCausal), 12);  // 192 MiB: every pair
  EXPECT_EQ(auto_group(16, 32768, 128, kCausal), 4);
  EXPECT_EQ(auto_group(16, 65536, 128, kCausal), 2);
  EXPECT_EQ(auto_group(12, 1 << 20, 128, kCausal), 1);
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal, kL2, 108), 16);
}

TEST(HeadGroup, SlowerDramTakesAnEighthOfTheSms) {
  // An H100 (3.35 TB/s): 132 / 8 = 16 at both head dims and masks, under the budget.
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal, kL2, kSms, kH100Dram), 16);
  EXPECT_EQ(auto_group(128, 2048, 128, kCausal, kL2, kSms, kH100Dram), 16);
  EXPECT_EQ(auto_group(256, 1024, 128, kFull, kL2, kSms, kH100Dram), 16);
  EXPECT_EQ(auto_group(768, 1024, 64, kCausal, kL2, kSms, kH100Dram), 16);  // GPT-2 124M, B = 64
  EXPECT_EQ(auto_group(256, 2048, 64, kFull, kL2, kSms, kH100Dram), 16);
  // The budget's group where it is smaller, as on an H200; every pair where they fit.
  EXPECT_EQ(auto_group(16, 32768, 128, kCausal, kL2, kSms, kH100Dram), 4);
  EXPECT_EQ(auto_group(32, 16384, 64, kFull, kL2, kSms, kH100Dram), 4);
  EXPECT_EQ(auto_group(6, 1024, 128, kCausal, kL2, kSms, kH100Dram), 6);
  // The threshold sits between the two GPUs; an unknown bandwidth (0) takes the H200's caps.
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal, kL2, kSms, 3.9e12), 16);
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal, kL2, kSms, 4.1e12), 32);
  EXPECT_EQ(auto_group(768, 1024, 64, kCausal, kL2, kSms, 0), 64);
  // Fewer than 8 SMs: one pair.
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal, kL2, 6, kH100Dram), 1);
}

TEST(HeadGroup, JustInTimeClaimsTakeTheGroupWhoseKeyTilesFillOneWave) {
  // 132 SMs / key tiles of 128 keys a pair, a power of two; masks and DRAM alike.
  for (bool causal : {kCausal, kFull}) {
    EXPECT_EQ(jit_group(256, 1024, causal), 16) << causal;  // 8 tiles: 16.5
    EXPECT_EQ(jit_group(128, 2048, causal), 8) << causal;
    EXPECT_EQ(jit_group(64, 4096, causal), 4) << causal;
    EXPECT_EQ(jit_group(32, 8192, causal), 2) << causal;
    EXPECT_EQ(jit_group(16, 16384, causal), 1) << causal;   // 128 tiles
    EXPECT_EQ(jit_group(16, 65536, causal), 1) << causal;   // more tiles than SMs: still one pair
    EXPECT_EQ(jit_group(256, 1024, causal, kSms, kH100Dram), 16) << causal;
    EXPECT_EQ(jit_group(256, 1024, causal, kSms, 0), 16) << causal;
  }
  // Partial key tiles count: 1000 keys are 8 tiles (16), 1025 are 9 (14, so 8).
  EXPECT_EQ(jit_group(256, 1000, kCausal), 16);
  EXPECT_EQ(jit_group(256, 1025, kCausal), 8);
  // Every pair when fewer; 108 SMs: 13, so 8.
  EXPECT_EQ(jit_group(6, 1024, kCausal), 6);
  EXPECT_EQ(jit_group(256, 1024, kCausal, 108), 8);
  // The rule of claims an item ahead at the same shapes differs (H200: 32 at 1K causal).
  EXPECT_EQ(auto_group(256, 1024, 128, kCausal), 32);
}

TEST(HeadGroup, ClaimsAreJustInTimeInEveryModeButOwner) {
  using cuda::attn::claims_just_in_time;
  for (int64_t D : {64, 128}) {
    for (DqMode mode : {DqMode::flat, DqMode::tma, DqMode::atomic}) EXPECT_TRUE(claims_just_in_time(mode, D)) << D;
    EXPECT_FALSE(claims_just_in_time(DqMode::owner, D)) << D;
  }
}

TEST(HeadGroup, ARequestIsTakenUpToEveryPair) {
  EXPECT_EQ(choose_head_group("all", 32, 16384, 64, kCausal, kL2, kSms, kH200Dram, false), 32);
  EXPECT_EQ(choose_head_group("1", 32, 16384, 64, kCausal, kL2, kSms, kH200Dram, false), 1);
  EXPECT_EQ(choose_head_group("3", 32, 16384, 128, kCausal, kL2, kSms, kH200Dram, false), 3);
  EXPECT_EQ(choose_head_group("100", 32, 16384, 64, kFull, kL2, kSms, kH200Dram, false), 32);
  for (const char* bad : {"0", "-2", "+2", " 2", "2x", "ALL", "four", "1e3"})
    EXPECT_THROW(choose_head_group(bad, 32, 16384, 64, kCausal, kL2, kSms, kH200Dram, false), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
