// The attention tile knobs and the sm90ws forward's tile (kernels/cuda/attention/tile_choice.h),
// on the CPU: the GPU tests (Cuda/FlashAttentionVsReference, both tiles of every kernel)
// check that every tile computes the right attention; these check what each setting and
// shape gets.
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "kernels/cuda/attention/tile_choice.h"
#include "src/errors.h"

namespace flashgpt {
namespace {

using cuda::attn::FwdTile;
using cuda::attn::parse_tile_choice;
using cuda::attn::persistent_fwd_tile;
using cuda::attn::sm90ws_forward_head_group;
using cuda::attn::sm80_tile;
using cuda::attn::sm90ws_forward_tile;
constexpr const char* kVar = "FLASHGPT_ATTENTION_FWD_TILE";

TEST(TileChoice, UnsetIsMinusOneAndZeroOrOneAreTaken) {
  EXPECT_EQ(parse_tile_choice(kVar, nullptr), -1);
  EXPECT_EQ(parse_tile_choice(kVar, ""), -1);
  EXPECT_EQ(parse_tile_choice(kVar, "0"), 0);
  EXPECT_EQ(parse_tile_choice(kVar, "1"), 1);
}

TEST(TileChoice, AnythingElseIsAnInputErrorNamingTheVariable) {
  for (const char* bad : {"2", "-1", "01", " 1", "yes", "auto"}) {
    try {
      parse_tile_choice(kVar, bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(kVar), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(TileChoice, Sm80TakesTheRequestedTileAndTileZeroWhenUnset) {
  EXPECT_EQ(sm80_tile(parse_tile_choice(kVar, nullptr)), 0);
  EXPECT_EQ(sm80_tile(0), 0);
  EXPECT_EQ(sm80_tile(1), 1);
}

TEST(TileChoice, Sm90wsTakesThreeConsumersAtHeadDim64UnlessCausalAndShort) {
  // GPT-2 124M's training step: causal, T = 1024: two consumers.
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 1024, /*causal=*/true), 0);
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 1, true), 0);
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 2047, true), 0);
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 2048, true), 1);   // the threshold itself
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 65536, true), 1);  // the long-context step
  for (int T : {1, 1024, 2048, 16384}) EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, /*causal=*/false), 1) << T;
}

TEST(TileChoice, Sm90wsKeeps128KeyTilesAtHeadDim128) {
  for (bool causal : {true, false})
    for (int T : {1, 1024, 2048, 16384, 65536}) EXPECT_EQ(sm90ws_forward_tile(-1, 128, T, causal), 0) << T;
}

TEST(TileChoice, ARequestedTileIsTakenEverywhere) {
  for (int D : {64, 128})
    for (bool causal : {true, false})
      for (int T : {1, 1024, 4096})
        for (int tile : {0, 1}) EXPECT_EQ(sm90ws_forward_tile(tile, D, T, causal), tile);
}

// The persistent forward's order: every (query tile, pair) exactly once, groups one after
// the other, and within a group the last query tiles of its pairs first.
TEST(PersistentForwardOrder, VisitsEveryTileOnceGroupByGroupHeaviestFirst) {
  for (int m_blocks : {1, 2, 7})
    for (int pairs : {1, 5, 6, 12})
      for (int group : {1, 2, 4, 5, 6, 12}) {
        if (group > pairs) continue;
        const std::string what = std::to_string(m_blocks) + " tiles, " + std::to_string(pairs) + " pairs, groups of " +
                                 std::to_string(group);
        std::vector<int> seen(size_t(m_blocks) * pairs, 0);
        int prev_group = 0;
        for (int t = 0; t < m_blocks * pairs; ++t) {
          const FwdTile f = persistent_fwd_tile(t, m_blocks, pairs, group);
          ASSERT_TRUE(f.m_block >= 0 && f.m_block < m_blocks && f.pair >= 0 && f.pair < pairs) << what << " t=" << t;
          ++seen[size_t(f.pair) * m_blocks + f.m_block];
          EXPECT_GE(f.pair / group, prev_group) << what << " t=" << t;  // groups in order
          prev_group = f.pair / group;
          if (t > 0) {
            const FwdTile g = persistent_fwd_tile(t - 1, m_blocks, pairs, group);
            if (g.pair / group == f.pair / group) EXPECT_LE(f.m_block, g.m_block) << what << " t=" << t;
          }
        }
        for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << what << " tile " << i;
      }
  // Groups of 4 of 6 pairs, 2 query tiles: pairs 0-3 (tile 1, then 0), then pairs 4-5.
  const int want[12][2] = {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {0, 0}, {0, 1}, {0, 2}, {0, 3},
                           {1, 4}, {1, 5}, {0, 4}, {0, 5}};
  for (int t = 0; t < 12; ++t) {
    const FwdTile f = persistent_fwd_tile(t, 2, 6, 4);
    EXPECT_EQ(f.m_block, want[t][0]) << t;
    EXPECT_EQ(f.pair, want[t][1]) << t;
  }
}

TEST(PersistentForwardOrder, AutoGroupKeepsKAndVInHalfTheL2) {
  constexpr int64_t kL2 = 50 << 20;  // an H200's
  // T·D·4 bytes a pair: 4 MiB at T = 16K, D = 64: 6 pairs in 25 MiB.
  EXPECT_EQ(sm90ws_forward_head_group(nullptr, 32, 16384, 64, kL2), 6);
  EXPECT_EQ(sm90ws_forward_head_group("auto", 32, 16384, 64, kL2), 6);
  EXPECT_EQ(sm90ws_forward_head_group(nullptr, 16, 16384, 128, kL2), 3);
  EXPECT_EQ(sm90ws_forward_head_group(nullptr, 512, 1024, 64, kL2), 100);  // 256 KiB a pair
  EXPECT_EQ(sm90ws_forward_head_group(nullptr, 12, 65536, 64, kL2), 1);    // 16 MiB
  EXPECT_EQ(sm90ws_forward_head_group(nullptr, 1, 1 << 20, 128, kL2), 1);  // never 0
  EXPECT_EQ(sm90ws_forward_head_group(nullptr, 4, 1024, 64, kL2), 4);      // never more than every pair
}

TEST(PersistentForwardOrder, ARequestedGroupIsTakenUpToEveryPair) {
  EXPECT_EQ(sm90ws_forward_head_group("all", 32, 16384, 64, 1), 32);
  EXPECT_EQ(sm90ws_forward_head_group("3", 32, 16384, 64, 1), 3);
  EXPECT_EQ(sm90ws_forward_head_group("40", 32, 16384, 64, 1), 32);
  for (const char* bad : {"0", "-2", "4x", " 4", "ALL"})
    EXPECT_THROW(sm90ws_forward_head_group(bad, 32, 16384, 64, 1), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
