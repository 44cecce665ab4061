// The attention tile knobs and the sm90ws forward's tile (kernels/cuda/attention/tile_choice.h),
// on the CPU: the GPU tests (Cuda/FlashAttentionVsReference, both tiles of every kernel)
// check that every tile computes the right attention; these check what each setting and
// shape gets.
#include <gtest/gtest.h>
#include <string>
#include "kernels/cuda/attention/tile_choice.h"
#include "src/errors.h"

namespace flashgpt {
namespace {

using cuda::attn::parse_tile_choice;
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

TEST(TileChoice, Sm90wsTakesOneConsumerAtHeadDim64UpTo1024) {
  using cuda::attn::kSm90WsOneConsumer;
  // GPT-2 124M's training step: causal, T = 1024.
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 1024, /*causal=*/true), kSm90WsOneConsumer);
  for (bool causal : {true, false})
    for (int T : {1, 17, 512, 1023, 1024}) EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, causal), kSm90WsOneConsumer) << T;
  EXPECT_NE(sm90ws_forward_tile(-1, 64, 1025, true), kSm90WsOneConsumer);  // the threshold is inclusive
  EXPECT_NE(sm90ws_forward_tile(-1, 64, 1025, false), kSm90WsOneConsumer);
}

TEST(TileChoice, Sm90wsTakesThreeConsumersAtHeadDim64UnlessCausalAndShort) {
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 1025, /*causal=*/true), 0);
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 2047, true), 0);
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 2048, true), 1);   // the threshold itself
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 65536, true), 1);  // the long-context step
  for (int T : {1025, 2048, 16384}) EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, /*causal=*/false), 1) << T;
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

TEST(TileChoice, Sm90wsRunsPersistentAtHeadDim128WithoutAMaskUpTo2048) {
  using cuda::attn::sm90ws_forward_persistent;
  for (const char* unset : {static_cast<const char*>(nullptr), "", "auto"}) {
    for (int T : {1, 1024, 2048}) EXPECT_TRUE(sm90ws_forward_persistent(unset, 0, 128, T, /*causal=*/false)) << T;
    EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 128, 2049, false));  // the threshold is inclusive
    EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 128, 1024, /*causal=*/true));
    EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 64, 1024, false));
    // Auto's own tile at those shapes is 0: the rule and the tile rule agree.
    EXPECT_EQ(cuda::attn::sm90ws_forward_tile(-1, 128, 1024, false), 0);
  }
}

TEST(TileChoice, Sm90wsPersistentOnRequestForTwoConsumerTilesOnly) {
  using cuda::attn::kSm90WsOneConsumer;
  using cuda::attn::sm90ws_forward_persistent;
  for (bool causal : {true, false})
    for (int T : {1, 4096, 65536}) {
      EXPECT_TRUE(sm90ws_forward_persistent("persistent", 0, 64, T, causal));
      EXPECT_TRUE(sm90ws_forward_persistent("persistent", 0, 128, T, causal));
      EXPECT_TRUE(sm90ws_forward_persistent("persistent", 1, 128, T, causal));   // two consumers, 64-key tiles
      EXPECT_FALSE(sm90ws_forward_persistent("persistent", 1, 64, T, causal));   // three consumers
      EXPECT_FALSE(sm90ws_forward_persistent("persistent", kSm90WsOneConsumer, 64, T, causal));
      EXPECT_FALSE(sm90ws_forward_persistent("grid", 0, 128, 1024, false));
    }
}

TEST(TileChoice, Sm90wsScheduleRejectsUnknownValues) {
  for (const char* bad : {"Persistent", "grid ", "1", "on"})
    EXPECT_THROW(cuda::attn::sm90ws_forward_persistent(bad, 0, 128, 1024, false), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
