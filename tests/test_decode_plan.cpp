// FlashDecoding's split plan and tile (kernels/cuda/attention/decode_plan.h), on the CPU:
// the GPU tests (Cuda/FlashDecodeVsReference) check that every split count and tile
// computes the right attention; these check which the plan takes. The GPU is an H200's:
// 132 SMs, the bulk kernel with 3 blocks resident on an SM at D = 64 (128 threads, tiles
// of 128 keys) and 2 at D = 128 (256 threads, tiles of 64 keys) with 16 KB of K a tile,
// and as many with 32 KB tiles (twice the keys, one stage); chunks of at most 16,384 keys.
#include <gtest/gtest.h>
#include <string>
#include "kernels/cuda/attention/decode_plan.h"
#include "tests/testing.h"

namespace flashgpt {
namespace {

using cuda::DecodePlan;
using cuda::plan_decode;
constexpr int64_t kSms = 132, kMaxChunk = 16384;

DecodePlan plan(int64_t B, int64_t T, int D, int want_splits = 0, int tile_kb = 16) {
  const int64_t H = D == 64 ? 12 : 16, tile = (D == 64 ? 128 : 64) * tile_kb / 16, resident = (D == 64 ? 3 : 2) * kSms;
  return plan_decode(B, H, T, tile, cuda::decode_max_chunk(B, H, T, tile, resident, kMaxChunk), resident, kSms,
                     want_splits);
}

TEST(DecodePlan, ChunksCoverTheCacheInWholeTiles) {
  for (int D : {64, 128})
    for (int64_t B : {1, 16})
      for (int64_t T : {1, 17, 64, 65, 1000, 4097, 65537, 1048583}) {
        const DecodePlan p = plan(B, T, D);
        const std::string at = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " D=" + std::to_string(D);
        EXPECT_EQ(p.chunk % (D == 64 ? 128 : 64), 0) << at;
        EXPECT_LE(p.chunk, kMaxChunk) << at;
        EXPECT_GE(p.chunk * p.splits, T) << at;
        EXPECT_LT(p.chunk * (p.splits - 1), T) << at << ": a split with no keys";
      }
}

TEST(DecodePlan, ForcedSplits) {
  EXPECT_EQ(plan(1, 4097, 64, 3).chunk, 1366);
  EXPECT_EQ(plan(1, 4097, 64, 3).splits, 3);
  EXPECT_EQ(plan(1, 5, 64, 100).splits, 5);  // at most one key a split
}

// The split counts that `scripts/bench_decode.py` printed for its 36 shapes on an H200
// with 16 KB tiles (BENCHMARKS.md, "Twenty-third session", call 5; the merge price from
// the ninth session; no cluster merge), but where decode_max_chunk's chunks of 8 tiles
// make 8 waves or more: there the split counts that were forced and measured faster on an
// H100 ("Seventy-fifth session"). Batch 1 spreads the few heads over the resident blocks;
// at batch 16 the (b, h) pairs already cover the SMs, so a split has to pay for its merge
// (one split up to 4K keys at D = 64; with 8 KB tiles two at 1K had been measured 0.0198 ms
// against 0.0172 for one) until the cache is long enough to stream in short chunks.
TEST(DecodePlan, TheSuiteShapesAsMeasured) {
  const int64_t lengths[] = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144};
  const int want[2][2][9] = {
      {{8, 16, 32, 32, 32, 32, 32, 32, 33}, {1, 1, 1, 2, 2, 32, 64, 128, 128}},      // D = 64: B = 1, 16
      {{16, 16, 16, 16, 16, 16, 16, 128, 147}, {1, 1, 1, 16, 32, 64, 128, 128, 128}}};  // D = 128
  for (int d = 0; d < 2; ++d)
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 9; ++i)
        EXPECT_EQ(plan(b ? 16 : 1, lengths[i], d ? 128 : 64).splits, want[d][b][i])
            << "B=" << (b ? 16 : 1) << " T=" << lengths[i] << " D=" << (d ? 128 : 64);
}

// The bulk kernel's tile: 16 KB unless FLASHGPT_DECODE_TILE_KB asks for 32.
TEST(DecodePlan, TheTileIs16KbUnlessAsked) {
  EXPECT_EQ(cuda::decode_bulk_tile_kb(nullptr), 16);
  EXPECT_EQ(cuda::decode_bulk_tile_kb(""), 16);
  EXPECT_EQ(cuda::decode_bulk_tile_kb("16"), 16);
  EXPECT_EQ(cuda::decode_bulk_tile_kb("32"), 32);
  for (const char* bad : {"8", "64", "32k", "auto", "16 "})
    EXPECT_THROW(cuda::decode_bulk_tile_kb(bad), InputError) << bad;
}

// Batch 16 with 32 KB tiles: the split counts printed for the suite's batch-16 shapes in
// the "Thirtieth session", calls 1 and 2 (FLASHGPT_DECODE_TILE_KB=32, one stage), but
// where decode_max_chunk's chunks of 8 tiles (twice the keys of 16 KB tiles) make 8 waves.
TEST(DecodePlan, TheBatch16ShapesWith32KbTiles) {
  const int64_t lengths[] = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144};
  const int want[2][9] = {{1, 1, 1, 1, 2, 2, 32, 64, 128}, {1, 1, 1, 1, 16, 32, 64, 128, 128}};  // D = 64, 128
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < 9; ++i)
      EXPECT_EQ(plan(16, lengths[i], d ? 128 : 64, 0, 32).splits, want[d][i]) << "T=" << lengths[i] << " D=" << (d ? 128 : 64);
}

// Chunks of 8 tiles once they make 8 waves of resident blocks, from the first key past:
// 192 pairs with tiles of 128 keys and 396 resident need 17 chunks of 1024 keys a pair
// (3264 blocks, against 3168), 12 pairs 264 (3168); longer chunks where 8 tiles would
// make more than 128 splits.
TEST(DecodePlan, TheStreamingChunkCap) {
  const int64_t resident = 3 * kSms;
  EXPECT_EQ(cuda::decode_max_chunk(16, 12, 16384, 128, resident, kMaxChunk), kMaxChunk);
  EXPECT_EQ(cuda::decode_max_chunk(16, 12, 16385, 128, resident, kMaxChunk), 1024);
  EXPECT_EQ(cuda::decode_max_chunk(1, 12, 263 * 1024, 128, resident, kMaxChunk), kMaxChunk);
  EXPECT_EQ(cuda::decode_max_chunk(1, 12, 263 * 1024 + 1, 128, resident, kMaxChunk), 2176);  // 17 tiles: 124 splits
  EXPECT_EQ(cuda::decode_max_chunk(16, 16, 32768, 64, 2 * kSms, kMaxChunk), 512);       // D = 128's tiles
  EXPECT_EQ(cuda::decode_max_chunk(16, 16, 262144, 64, 2 * kSms, 256), 256);            // a kernel's own lower limit
  EXPECT_EQ(cuda::decode_max_chunk(1, 1, 8 * 1024, 128, /*resident=*/0, kMaxChunk), 1024);  // at least one resident
  EXPECT_EQ(cuda::decode_max_chunk(16, 12, 131072, 128, resident, kMaxChunk), 1024);      // 128 splits
  EXPECT_EQ(cuda::decode_max_chunk(16, 12, 131073, 128, resident, kMaxChunk), 1152);      // 9 tiles, 114 splits
  EXPECT_EQ(cuda::decode_max_chunk(16, 16, 262144, 64, 2 * kSms, kMaxChunk), 2048);
}

// Without the merge price batch 16 at D = 64 would split short caches in two (the old plan,
// slower there); with fewer pairs than SMs the price does not apply.
TEST(DecodePlan, TheMergePriceAppliesOnlyWhenThePairsCoverTheSms) {
  EXPECT_EQ(plan_decode(16, 12, 1024, 64, kMaxChunk, 3 * kSms, /*sms=*/16 * 12 + 1, 0).splits, 2);
  EXPECT_EQ(plan_decode(16, 12, 1024, 64, kMaxChunk, 3 * kSms, /*sms=*/16 * 12, 0).splits, 1);
}

// The tensor-core kernel's merge in a thread-block cluster (max_cluster = 8): at batch 1,
// where 8 chunks of at most 8K keys cover the cache (up to 64K keys), 8 splits, a
// cluster; from 128K keys the model's plans as before, merged through L2. At batch 16 the
// model's plans with the cluster's smaller merge price: 2 splits as a cluster from 2K keys
// (their blocks fit in one wave: 384 of the 396 resident), one at 1K, and not a cluster
// with 4 (64K keys; measured 3.5% slower as a cluster).
TEST(DecodePlan, TheClusterMergeCapsTheSplitsWhereItCoversTheCache) {
  const int64_t lengths[] = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144};
  const int want[2][9] = {{8, 8, 8, 8, 8, 8, 8, 32, 33}, {1, 2, 2, 2, 2, 2, 4, 8, 35}};  // B = 1, 16 (D = 64)
  const bool cluster[2][9] = {{true, true, true, true, true, true, true, false, false},
                              {false, true, true, true, true, true, false, false, false}};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 9; ++i) {
      const DecodePlan p = plan_decode(b ? 16 : 1, 12, lengths[i], 128, kMaxChunk, 3 * kSms, kSms, 0, 8);
      const std::string at = "B=" + std::to_string(b ? 16 : 1) + " T=" + std::to_string(lengths[i]);
      EXPECT_EQ(p.splits, want[b][i]) << at;
      EXPECT_EQ(p.cluster, cluster[b][i]) << at;
      EXPECT_GE(p.chunk * p.splits, lengths[i]) << at;
      EXPECT_EQ(p.chunk % 128, 0) << at;
    }
  // Forced splits: a cluster up to 8, when they fit in one wave.
  EXPECT_TRUE(plan_decode(1, 12, 4097, 128, kMaxChunk, 3 * kSms, kSms, 3, 8).cluster);
  EXPECT_FALSE(plan_decode(16, 12, 4097, 128, kMaxChunk, 3 * kSms, kSms, 3, 8).cluster);
  EXPECT_TRUE(plan_decode(1, 12, 4097, 128, kMaxChunk, 3 * kSms, kSms, 8, 8).cluster);
  EXPECT_FALSE(plan_decode(1, 12, 4097, 128, kMaxChunk, 3 * kSms, kSms, 9, 8).cluster);
  EXPECT_FALSE(plan_decode(1, 12, 4097, 128, kMaxChunk, 3 * kSms, kSms, 1, 8).cluster);
  // Without it (the other kernels, or FLASHGPT_DECODE_CLUSTER=0): the plans of
  // TheSuiteShapesAsMeasured, never a cluster.
  const DecodePlan off = plan_decode(1, 12, 16384, 128, kMaxChunk, 3 * kSms, kSms, 0, 0);
  EXPECT_EQ(off.splits, 32);
  EXPECT_FALSE(off.cluster);
  EXPECT_FALSE(plan_decode(1, 12, 4097, 128, kMaxChunk, 3 * kSms, kSms, 3, 0).cluster);
}

// The cluster merge (FLASHGPT_DECODE_CLUSTER) and the overlapped launch (FLASHGPT_DECODE_PDL).
TEST(DecodePlan, TheSwitchesAreOnUnlessAskedOff) {
  for (bool (*on)(const char*) : {cuda::decode_cluster_merge, cuda::decode_overlap}) {
    EXPECT_TRUE(on(nullptr));
    EXPECT_TRUE(on(""));
    EXPECT_TRUE(on("1"));
    EXPECT_FALSE(on("0"));
    for (const char* bad : {"yes", "2", "off", " 1", "1 "}) EXPECT_THROW(on(bad), InputError) << bad;
  }
  test::expect_input_error([] { cuda::decode_overlap("on"); }, {"FLASHGPT_DECODE_PDL must be 0 or 1, got 'on'"});
}

}  // namespace
}  // namespace flashgpt
