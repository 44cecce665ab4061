// The attention tile knobs and the sm90ws forward's tile (kernels/cuda/attention/tile_choice.h),
// on the CPU: the GPU tests (Cuda/FlashAttentionVsReference, both tiles of every kernel)
// check that every tile computes the right attention; these check what each setting and
// shape gets.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>
#include "kernels/cuda/attention/tile_choice.h"
#include "src/errors.h"
#include "tests/testing.h"

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
    SCOPED_TRACE(std::string("'") + bad + "'");
    test::expect_input_error([&] { parse_tile_choice(kVar, bad); }, {kVar, bad});
  }
}

TEST(TileChoice, Sm80TakesTheRequestedTileAndTileZeroWhenUnset) {
  EXPECT_EQ(sm80_tile(parse_tile_choice(kVar, nullptr)), 0);
  EXPECT_EQ(sm80_tile(0), 0);
  EXPECT_EQ(sm80_tile(1), 1);
}

TEST(TileChoice, Sm90wsTakesOneConsumerAtHeadDim64BelowT320WithoutAMask) {
  using cuda::attn::FwdSchedule;
  using cuda::attn::kSm90WsOneConsumer;
  for (int T : {1, 17, 256, 319}) {
    EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, /*causal=*/false), kSm90WsOneConsumer) << T;
    EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, false, FwdSchedule::grid), kSm90WsOneConsumer) << T;
  }
  // From T = 320 on without a mask: three consumers (the threshold itself included).
  for (auto schedule : {FwdSchedule::automatic, FwdSchedule::grid, FwdSchedule::persistent})
    for (int T : {320, 384, 512, 1023, 1024}) EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, false, schedule), 1) << T;
  for (int T : {1, 17, 512, 1023, 1024}) {
    // Causal: tile 0, persistent (GPT-2 124M's training step: T = 1024); with the schedule
    // held to a block per tile, the one-consumer tile.
    EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, /*causal=*/true), 0) << T;
    EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, true, FwdSchedule::persistent), 0) << T;
    EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, true, FwdSchedule::grid), kSm90WsOneConsumer) << T;
  }
  EXPECT_NE(sm90ws_forward_tile(-1, 64, 1025, true, FwdSchedule::grid), kSm90WsOneConsumer);  // the threshold is inclusive
}

TEST(TileChoice, Sm90wsTakesThreeConsumersAtHeadDim64UnlessCausalAndShort) {
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 1025, /*causal=*/true), 0);  // pairs unknown
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 2047, true), 0);
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 2048, true), 1);   // the threshold itself
  EXPECT_EQ(sm90ws_forward_tile(-1, 64, 65536, true), 1);  // the long-context step
  for (int T : {1024, 1025, 2048, 16384}) EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, /*causal=*/false), 1) << T;
}

// Under a causal mask below T = 2048: three consumers where their query tiles number at
// least 5 an SM (ceil(T / 192) · B · H ≥ 5 · SMs) from T = 384, else as with the pairs
// unknown (two, or one under the grid schedule up to 1K).
TEST(TileChoice, Sm90wsTakesThreeConsumersUnderACausalMaskWithEnoughTiles) {
  using cuda::attn::FwdSchedule;
  using cuda::attn::kSm90WsOneConsumer;
  const auto tile = [](int T, int64_t pairs, FwdSchedule s = FwdSchedule::automatic, int sms = 132) {
    return sm90ws_forward_tile(-1, 64, T, /*causal=*/true, s, pairs, sms);
  };
  EXPECT_EQ(tile(1024, 64 * 12), 1);  // GPT-2 124M's step: 4,608 tiles
  EXPECT_EQ(tile(1024, 16 * 32), 1);
  EXPECT_EQ(tile(1024, 16 * 12), 1);  // 1,152
  EXPECT_EQ(tile(1024, 96), 0);       // 576
  EXPECT_EQ(tile(768, 96), 0);        // 384
  EXPECT_EQ(tile(640, 192), 1);       // 768
  EXPECT_EQ(tile(512, 192), 0);       // 576
  EXPECT_EQ(tile(1536, 48), 0);       // 384
  EXPECT_EQ(tile(1536, 96), 1);       // 768
  EXPECT_EQ(tile(1792, 1), 0);
  EXPECT_EQ(tile(320, 100000), 0);  // below T = 384
  EXPECT_EQ(tile(384, 330), 1);     // 660 = 5 · 132: the threshold itself
  EXPECT_EQ(tile(384, 329), 0);
  EXPECT_EQ(tile(384, 330, FwdSchedule::automatic, 133), 0);  // scales with the SMs
  EXPECT_EQ(tile(384, 330, FwdSchedule::persistent), 1);
  EXPECT_EQ(tile(1024, 768, FwdSchedule::grid), kSm90WsOneConsumer);  // the grid up to 1K: as before
  EXPECT_EQ(tile(1152, 768, FwdSchedule::grid), 1);
  EXPECT_EQ(tile(1152, 12, FwdSchedule::grid), 0);
  for (int T : {2048, 65536}) EXPECT_EQ(tile(T, 1), 1) << T;  // from 2K whatever the tiles
}

// The grid block's consumers with rows before T (64 rows each): every one but in a
// sequence's short last query tile, never none.
TEST(TileChoice, Sm90wsGridStartsOnlyTheConsumersWithRows) {
  using cuda::attn::sm90ws_busy_consumers;
  // Three consumers, 192 rows a block: the last block at T = 1024 starts at 960.
  EXPECT_EQ(sm90ws_busy_consumers(1024, 960, 3), 1);
  EXPECT_EQ(sm90ws_busy_consumers(1024, 768, 3), 3);
  EXPECT_EQ(sm90ws_busy_consumers(2048, 1920, 3), 2);   // 128 rows
  EXPECT_EQ(sm90ws_busy_consumers(4100, 4032, 3), 2);   // 68 rows: a partial second consumer
  EXPECT_EQ(sm90ws_busy_consumers(1023, 960, 3), 1);    // 63 rows
  EXPECT_EQ(sm90ws_busy_consumers(1, 0, 3), 1);
  EXPECT_EQ(sm90ws_busy_consumers(113, 0, 3), 2);
  EXPECT_EQ(sm90ws_busy_consumers(65536, 65472, 3), 1);
  // Two consumers, 128 rows a block; one consumer is always busy.
  EXPECT_EQ(sm90ws_busy_consumers(1025, 1024, 2), 1);
  EXPECT_EQ(sm90ws_busy_consumers(1024, 896, 2), 2);
  EXPECT_EQ(sm90ws_busy_consumers(17, 0, 1), 1);
  // Every block of every T up to 1000 at each count: as many as the rows need, at most all.
  for (int consumers : {1, 2, 3})
    for (int T = 1; T <= 1000; ++T)
      for (int m0 = 0; m0 < T; m0 += 64 * consumers) {
        const int busy = sm90ws_busy_consumers(T, m0, consumers);
        ASSERT_GE(busy, 1);
        ASSERT_LE(busy, consumers);
        ASSERT_LT(m0 + 64 * (busy - 1), T) << "a busy consumer with no rows";
        if (busy < consumers) ASSERT_GE(m0 + 64 * busy, T) << "a consumer with rows left out";
      }
}

// Without a mask the three-consumer grid kernel splits the key tiles of a query tile with
// one consumer's rows between its three consumers; never under a causal mask (the short
// tile comes first there and needs one key tile) or with another consumer count.
TEST(TileChoice, Sm90wsSplitsKeyTilesOnlyForOneConsumersRowsWithoutAMask) {
  using cuda::attn::sm90ws_busy_consumers;
  using cuda::attn::sm90ws_splits_keys;
  EXPECT_TRUE(sm90ws_splits_keys(false, 3, sm90ws_busy_consumers(1024, 960, 3)));   // T = 1024: 64 rows
  EXPECT_FALSE(sm90ws_splits_keys(false, 3, sm90ws_busy_consumers(1024, 768, 3)));  // a full tile
  EXPECT_FALSE(sm90ws_splits_keys(false, 3, sm90ws_busy_consumers(2048, 1920, 3)));  // 128 rows: two consumers
  EXPECT_FALSE(sm90ws_splits_keys(true, 3, 1));
  EXPECT_FALSE(sm90ws_splits_keys(false, 2, 1));
  EXPECT_FALSE(sm90ws_splits_keys(false, 1, 1));
  // A sequence's last tile: T mod 192 from 1 to 64.
  for (int T = 1; T <= 5000; ++T)
    ASSERT_EQ(cuda::attn::sm90ws_splits_last_tile(T), T % 192 >= 1 && T % 192 <= 64) << T;
}
// In a split tile the producer loads every V once, after its K, in key-tile order (a
// ring stage's V tiles in the order of their phases), V of key tile j >= 3 only once K of
// j + 3 is loaded or the tile's K are all loaded, and V of 0-2 right after their K.
TEST(TileChoice, Sm90wsSplitTileLoadsEachVOnceAfterItsK) {
  using namespace cuda::attn;
  for (int n = 1; n <= 40; ++n) {
    std::vector<std::pair<int, int>> loads;  // (V's key tile, the K loaded before it; n: after the last)
    for (int nb = 0; nb < n; ++nb)
      if (sm90ws_split_v_at(nb) >= 0) loads.push_back({sm90ws_split_v_at(nb), nb});
    for (int j = sm90ws_split_v_tail(n); j < n; ++j) loads.push_back({j, n});
    ASSERT_EQ(loads.size(), size_t(n)) << "n=" << n;
    for (int j = 0; j < n; ++j) {
      ASSERT_EQ(loads[size_t(j)].first, j) << "n=" << n << ": V out of order";
      const int after = loads[size_t(j)].second;
      ASSERT_GE(after, j) << "n=" << n << ": V of " << j << " before its K";
      if (j < 3) ASSERT_EQ(after, j) << "n=" << n;
      else ASSERT_EQ(after, std::min(j + 3, n)) << "n=" << n;
    }
  }
}
// Under a causal mask the three-consumer tiles put the sequence's short tile first: the
// tiles number ceil(T / 192) as before, cover rows 0 .. T − 1 once each in order, start on
// 64-row slabs, and only the first may hold fewer than three slabs (the last ends at T).
TEST(TileChoice, Sm90wsShortQueryTileComesFirst) {
  using cuda::attn::sm90ws_lead_shift, cuda::attn::sm90ws_tile_m0, cuda::attn::sm90ws_tile_end,
      cuda::attn::sm90ws_busy_consumers;
  EXPECT_EQ(sm90ws_lead_shift(1024, 192), 128);  // 16 slabs: rows 0-63 first, then 64 + 192k
  EXPECT_EQ(sm90ws_lead_shift(2048, 192), 64);   // 32 slabs: rows 0-127 first
  EXPECT_EQ(sm90ws_lead_shift(1152, 192), 0);    // 18 slabs
  EXPECT_EQ(sm90ws_lead_shift(1023, 192), 128);  // 16 slabs, the last one partial
  EXPECT_EQ(sm90ws_tile_m0(1, 192, 128), 64);
  EXPECT_EQ(sm90ws_tile_end(0, 192, 128, 1024), 64);
  EXPECT_EQ(sm90ws_busy_consumers(sm90ws_tile_end(0, 192, 128, 1024), 0, 3), 1);
  EXPECT_EQ(sm90ws_tile_end(5, 192, 128, 1024), 1024);
  // The kernels' view (sm90ws_first_row, sm90ws_row_end): shifted where they skip key tiles,
  // else m_block · BM up to T.
  EXPECT_EQ(cuda::attn::sm90ws_first_row(true, 1, 192, 1024), 64);
  EXPECT_EQ(cuda::attn::sm90ws_row_end(true, 0, 192, 1024), 64);
  EXPECT_EQ(cuda::attn::sm90ws_first_row(false, 5, 192, 1024), 960);
  EXPECT_EQ(cuda::attn::sm90ws_row_end(false, 5, 192, 1024), 1024);
  EXPECT_EQ(cuda::attn::sm90ws_row_end(false, 2, 128, 1024), 384);
  for (int T = 1; T <= 5000; ++T) {
    const int shift = sm90ws_lead_shift(T, 192), tiles = (T + 191) / 192;
    ASSERT_EQ(shift % 64, 0);
    ASSERT_LT(shift, 192);
    int next = 0;  // the first row not yet covered
    for (int m = 0; m < tiles; ++m) {
      const int m0 = sm90ws_tile_m0(m, 192, shift), end = sm90ws_tile_end(m, 192, shift, T);
      ASSERT_EQ(m0, next) << "T=" << T << " tile " << m;
      ASSERT_EQ(m0 % 64, 0);
      ASSERT_GT(end, m0) << "T=" << T << ": an empty tile " << m;
      if (m > 0 && m + 1 < tiles) ASSERT_EQ(end - m0, 192) << "T=" << T << ": a short tile " << m;
      const int busy = sm90ws_busy_consumers(end, m0, 3);
      ASSERT_GE(m0 + 64 * busy, end) << "T=" << T << " tile " << m << ": rows left out";
      ASSERT_LT(m0 + 64 * (busy - 1), end) << "T=" << T << " tile " << m << ": a consumer with no rows";
      next = end;
    }
    ASSERT_EQ(next, T);
    // The last tile is full: its three slabs reach T (the last slab perhaps partial).
    if (tiles > 1) ASSERT_LT(sm90ws_tile_m0(tiles - 1, 192, shift) + 192 - T, 64) << "T=" << T;
  }
}

// Under a causal mask: each consumer of a block runs the key tiles up to the one holding
// its last row's key, and no fewer; key tile nb's consumers are a suffix of the busy ones
// that always holds the last. With 128 rows a block (two consumers) nobody skips.
TEST(TileChoice, Sm90wsConsumersSkipOnlyKeyTilesAfterTheirRows) {
  using cuda::attn::sm90ws_busy_consumers;
  using cuda::attn::sm90ws_consumer_key_tiles;
  using cuda::attn::sm90ws_first_consumer_of;
  using cuda::attn::sm90ws_next_turn;
  using cuda::attn::sm90ws_turn_offset;
  constexpr int BN = 128;
  // T = 2048, the block of rows 192..383: key tiles 0-2; consumer 0 (rows 192-255) needs
  // two of them, key tile 2 (keys 256-383) is consumers 1 and 2's.
  EXPECT_EQ(sm90ws_consumer_key_tiles(192, 0, BN, 3), 2);
  EXPECT_EQ(sm90ws_consumer_key_tiles(192, 1, BN, 3), 3);
  EXPECT_EQ(sm90ws_first_consumer_of(2, BN, 192), 1);
  EXPECT_EQ(sm90ws_first_consumer_of(1, BN, 0), 2);  // rows 0-191: only rows 128.. see keys 128..
  int skipped = 0;
  for (int consumers : {2, 3})
    for (int T = 1; T <= 3000; ++T)
      for (int m0 = 0; m0 < T; m0 += 64 * consumers) {
        const int n_blocks = (std::min(T, m0 + 64 * consumers) + BN - 1) / BN;
        const int busy = sm90ws_busy_consumers(T, m0, consumers);
        // (The persistent kernel runs every consumer, those without rows too: they skip nothing.)
        for (int c = busy; c < consumers; ++c) ASSERT_EQ(sm90ws_consumer_key_tiles(m0, c, BN, n_blocks), n_blocks);
        for (int c = 0; c < busy; ++c) {
          const int mine = sm90ws_consumer_key_tiles(m0, c, BN, n_blocks);
          const int last_row = std::min(m0 + 64 * c + 63, T - 1);
          ASSERT_GE(mine, 1);
          ASSERT_LE((mine - 1) * BN, last_row) << "a key tile that consumer " << c << " sees none of";
          if (mine < n_blocks) ASSERT_GT(mine * BN, last_row) << "a key tile left out that consumer " << c << " sees";
          if (c == busy - 1) ASSERT_EQ(mine, n_blocks) << "the last busy consumer runs every key tile";
          if (consumers == 2) ASSERT_EQ(mine, n_blocks) << "128-row blocks skip nothing";
          skipped += n_blocks - mine;
          for (int nb = 0; nb < n_blocks; ++nb) {
            ASSERT_EQ(c >= sm90ws_first_consumer_of(nb, BN, m0), nb < mine)
                << "T " << T << " m0 " << m0 << " nb " << nb;
            ASSERT_EQ(sm90ws_next_turn(nb, BN, sm90ws_turn_offset(BN, m0)),
                      1 + sm90ws_first_consumer_of(nb + 1, BN, m0));
          }
        }
      }
  EXPECT_GT(skipped, 0);
}

// At D = 128: 128-key tiles under a causal mask and up to T = 8191 without one; 176-key
// tiles (tile 1) without a mask from T = 8192.
TEST(TileChoice, Sm90wsTakes176KeyTilesAtHeadDim128OnlyWithoutAMaskFrom8K) {
  for (int T : {1, 1024, 2048, 8192, 16384, 65536}) EXPECT_EQ(sm90ws_forward_tile(-1, 128, T, /*causal=*/true), 0) << T;
  for (int T : {1, 1024, 2048, 4096, 8191}) EXPECT_EQ(sm90ws_forward_tile(-1, 128, T, /*causal=*/false), 0) << T;
  for (int T : {8192, 16384, 65536}) EXPECT_EQ(sm90ws_forward_tile(-1, 128, T, /*causal=*/false), 1) << T;
  for (auto schedule : {cuda::attn::FwdSchedule::grid, cuda::attn::FwdSchedule::persistent})
    EXPECT_EQ(sm90ws_forward_tile(-1, 128, 16384, false, schedule), 1);
}

TEST(TileChoice, ARequestedTileIsTakenEverywhere) {
  for (int D : {64, 128})
    for (bool causal : {true, false})
      for (int T : {1, 1024, 4096})
        for (int tile : {0, 1}) EXPECT_EQ(sm90ws_forward_tile(tile, D, T, causal), tile);
}

TEST(TileChoice, Sm90wsRunsPersistentAtShortSequences) {
  using cuda::attn::FwdSchedule;
  using cuda::attn::sm90ws_forward_persistent;
  const FwdSchedule unset = cuda::attn::parse_forward_schedule(nullptr);
  EXPECT_EQ(unset, FwdSchedule::automatic);
  EXPECT_EQ(cuda::attn::parse_forward_schedule(""), FwdSchedule::automatic);
  for (bool causal : {true, false}) {
    // D = 128: auto's tile is 0; persistent up to T = 2048 under a causal mask and up to
    // 4096 without one, inclusive.
    const int last = causal ? 2048 : 4096;
    for (int T : {1, 1024, 2048, 4096}) {
      if (T > last) continue;
      EXPECT_EQ(sm90ws_forward_tile(-1, 128, T, causal), 0) << T;
      EXPECT_TRUE(sm90ws_forward_persistent(unset, 0, 128, T, causal)) << T;
    }
    EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 128, last + 1, causal));
    EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 128, 65536, causal));
  }
  EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 128, 4096, /*causal=*/true));
  // D = 64: causal up to T = 16384 (tile 0 up to 1K, tile 1 from 2K: see the tile rule),
  // nothing else.
  for (int T : {1, 1024, 2048, 4096, 8192, 16384}) {
    EXPECT_EQ(sm90ws_forward_tile(-1, 64, T, true), T <= 1024 ? 0 : 1) << T;
    EXPECT_TRUE(sm90ws_forward_persistent(unset, sm90ws_forward_tile(-1, 64, T, true), 64, T, true)) << T;
  }
  EXPECT_FALSE(sm90ws_forward_persistent(unset, 1, 64, 16385, true));
  EXPECT_FALSE(sm90ws_forward_persistent(unset, 0, 64, 1024, false));
  // Without a mask three consumers below T = 1024 where the last query tile has more than
  // one consumer's rows (T mod 192 = 0 or above 64; the grid splits a tile of one
  // consumer's rows); one consumer below 320 a block per tile.
  for (int T = 1; T <= 4096; ++T) {
    const int tile = sm90ws_forward_tile(-1, 64, T, false);
    const bool persistent = T >= 320 && T < 1024 && (T % 192 == 0 || T % 192 > 64);
    ASSERT_EQ(sm90ws_forward_persistent(unset, tile, 64, T, false), persistent) << T;
  }
  for (int T : {320, 384, 512, 576, 768, 896, 960}) EXPECT_TRUE(sm90ws_forward_persistent(unset, 1, 64, T, false)) << T;
  for (int T : {448, 640, 1023, 1024, 1152, 2048}) EXPECT_FALSE(sm90ws_forward_persistent(unset, 1, 64, T, false)) << T;
  EXPECT_FALSE(sm90ws_forward_persistent(unset, sm90ws_forward_tile(-1, 64, 65536, true), 64, 65536, true));
}

TEST(TileChoice, Sm90wsPersistentOnRequestForTwoAndThreeConsumers) {
  using cuda::attn::FwdSchedule;
  using cuda::attn::kSm90WsOneConsumer;
  using cuda::attn::sm90ws_forward_persistent;
  const FwdSchedule on = cuda::attn::parse_forward_schedule("persistent");
  const FwdSchedule off = cuda::attn::parse_forward_schedule("grid");
  for (bool causal : {true, false})
    for (int T : {1, 1024, 4096, 65536}) {
      EXPECT_TRUE(sm90ws_forward_persistent(on, 0, 64, T, causal));
      EXPECT_TRUE(sm90ws_forward_persistent(on, 0, 128, T, causal));
      EXPECT_FALSE(sm90ws_forward_persistent(on, 1, 128, T, causal));  // 176-key tiles: a block per tile
      EXPECT_TRUE(sm90ws_forward_persistent(on, 1, 64, T, causal));  // three consumers
      EXPECT_FALSE(sm90ws_forward_persistent(on, kSm90WsOneConsumer, 64, T, causal));
      for (int D : {64, 128})
        for (int tile : {0, 1}) EXPECT_FALSE(sm90ws_forward_persistent(off, tile, D, T, causal));
    }
}

// The persistent forward's grid balances its rounds: a brute-force check of the chosen G
// against every G in range, the two shapes worked out by hand in BENCHMARKS.md, and the
// edges (full masks, fewer tiles than blocks, one block).
TEST(TileChoice, PersistentForwardGridBalancesTheRounds) {
  using cuda::attn::persistent_forward_grid;
  using cuda::attn::persistent_forward_max_load;
  // 1 x 16 x 16K causal, 128-row tiles: 132 blocks leave one block 1.54x the mean (a round
  // is a head and 4 tiles of the next), 128 (a round is a head) exactly the mean.
  const int64_t total = 16 * (128 * 129 / 2);
  EXPECT_EQ(persistent_forward_max_load(132, 16, 16384, 128, 128, true) * 132 * 100 / total, 154);
  EXPECT_EQ(persistent_forward_max_load(128, 16, 16384, 128, 128, true) * 128 * 100 / total, 100);
  EXPECT_EQ(persistent_forward_grid(132, 16, 16384, 128, 128, true), 128);
  // 16 x 16 x 1K causal (8 tiles a head): 132 blocks already balance; kept.
  EXPECT_EQ(persistent_forward_grid(132, 256, 1024, 128, 128, true), 132);
  // Whatever the shape, no G in [max / 2, max] does better, and ties go to the larger G.
  for (int64_t heads : {1, 7, 12, 32})
    for (int T : {100, 1024, 3000, 8192})
      for (int BM : {128, 192}) {
        const int g = persistent_forward_grid(132, heads, T, BM, 128, true);
        const int64_t tiles = (T + BM - 1) / BM * heads, top = std::min<int64_t>(132, tiles);
        ASSERT_GE(g, std::max<int64_t>(1, top / 2));
        ASSERT_LE(g, top);
        const int64_t best = persistent_forward_max_load(g, heads, T, BM, 128, true);
        for (int64_t G = std::max<int64_t>(1, top / 2); G <= top; ++G) {
          const int64_t load = persistent_forward_max_load(G, heads, T, BM, 128, true);
          EXPECT_TRUE(load > best || (load == best && G <= g)) << heads << " x " << T << " BM " << BM << " G " << G;
        }
      }
  // Full masks: equal tiles, every block (or every tile, when fewer).
  EXPECT_EQ(persistent_forward_grid(132, 16, 16384, 128, 128, false), 132);
  EXPECT_EQ(persistent_forward_grid(132, 2, 1024, 128, 128, false), 16);
  EXPECT_EQ(persistent_forward_grid(132, 2, 1024, 128, 128, true), 16);
  EXPECT_EQ(persistent_forward_grid(1, 12, 4096, 192, 128, true), 1);
}

// The persistent forward's schedule with a list after the rounds: every tile exactly once,
// by the kernel's own tile_of (persistent_forward_tile); a block's list ends at its first
// −1; never a busier block than the rounds alone; the busiest block at the shapes of
// BENCHMARKS.md ("Fifty-ninth session") against the rounds'; and no list without a
// causal mask, with FLASHGPT_ATTENTION_FWD_TAIL=off, or on more blocks than the table has.
TEST(TileChoice, PersistentForwardListTakesEveryTileOnceAndBalancesTheBlocks) {
  using cuda::attn::ForwardTail;
  using cuda::attn::kTailSlots;
  using cuda::attn::PersistentSchedule;
  using cuda::attn::persistent_forward_schedule;
  using cuda::attn::persistent_forward_list_cost;
  using cuda::attn::persistent_forward_tile;
  using cuda::attn::persistent_forward_tile_cost;
  // Each block's load: key tiles, or in the schedule's model (persistent_forward_list_cost);
  // checks that the blocks take every tile once.
  auto loads = [](const PersistentSchedule& s, int64_t heads, int T, int BM, bool causal, bool model) {
    const int64_t m_blocks = (T + BM - 1) / BM, tiles = m_blocks * heads;
    std::vector<int> seen(size_t(tiles), 0);
    std::vector<int64_t> load(size_t(s.blocks), 0);
    for (int b = 0; b < s.blocks; ++b) {
      int local = 0;
      for (int t; (t = persistent_forward_tile(s.tail, local, b, s.blocks, int(tiles))) >= 0; ++local) {
        EXPECT_LT(t, tiles);
        if (t >= tiles) break;
        ++seen[size_t(t)];
        load[size_t(b)] += model ? persistent_forward_list_cost(t, m_blocks, T, BM, 128, causal)
                                 : persistent_forward_tile_cost(t, m_blocks, T, BM, 128, causal);
      }
      if (local >= s.tail.rounds) {  // the list: nothing after its first −1
        for (int j = local - s.tail.rounds; j < kTailSlots; ++j) EXPECT_EQ(s.tail.tile[b][j], -1) << "block " << b;
      }
    }
    for (int64_t t = 0; t < tiles; ++t) EXPECT_EQ(seen[size_t(t)], 1) << "tile " << t;
    return *std::max_element(load.begin(), load.end());
  };
  int lists = 0;
  for (int64_t heads : {1, 6, 7, 12, 32, 192, 512, 768})
    for (int T : {100, 1023, 1024, 2048, 3000})
      for (int BM : {128, 192})
        for (int max_blocks : {3, 5, 132})
          for (bool exact : {false, true})
            for (bool causal : {true, false}) {
              SCOPED_TRACE(std::to_string(heads) + " pairs, T " + std::to_string(T) + ", BM " + std::to_string(BM) +
                           ", " + std::to_string(max_blocks) + (exact ? " exact" : "") + (causal ? " causal" : " full"));
              const PersistentSchedule with = persistent_forward_schedule(max_blocks, heads, T, BM, 128, causal, exact, true);
              const PersistentSchedule alone = persistent_forward_schedule(max_blocks, heads, T, BM, 128, causal, exact, false);
              ASSERT_EQ(alone.tail.rounds, INT32_MAX);
              const int64_t tiles = (T + BM - 1) / BM * heads, top = std::min<int64_t>(max_blocks, tiles);
              EXPECT_EQ(alone.blocks, exact ? top : cuda::attn::persistent_forward_grid(max_blocks, heads, T, BM, 128, causal));
              const int64_t busiest = loads(with, heads, T, BM, causal, true);
              const int64_t rounds = loads(alone, heads, T, BM, causal, true);
              if (with.tail.rounds == INT32_MAX) {
                EXPECT_EQ(with.blocks, alone.blocks);
              } else {
                ++lists;
                EXPECT_TRUE(causal);
                EXPECT_EQ(with.blocks, top);
                EXPECT_LT(busiest, rounds);
              }
            }
  EXPECT_GT(lists, 100);
  // Key tiles of the busiest block on 132 blocks, list against rounds: 16 × 12 × 1K 53
  // against 54, 16 × 32 × 1K 140 against 144, GPT-2's 64 × 12 × 1K 210 against 215.
  for (const auto& [heads, with_list, rounds] : {std::tuple<int, int, int>{192, 53, 54}, {512, 140, 144}, {768, 210, 215}}) {
    SCOPED_TRACE(std::to_string(heads) + " pairs");
    EXPECT_EQ(loads(persistent_forward_schedule(132, heads, 1024, 128, 128, true, false, true), heads, 1024, 128, true, false),
              with_list);
    EXPECT_EQ(loads(persistent_forward_schedule(132, heads, 1024, 128, 128, true, false, false), heads, 1024, 128, true, false),
              rounds);
  }
  // Shapes where a shorter run of rounds beats a longer one that beat the rounds alone: the
  // schedule once started the second list from the first, whose entries stayed in the
  // slots the second left free (tiles taken twice).
  for (const auto& [heads, T] : {std::pair<int, int>{64, 832}, {267, 576}, {18, 3776}}) {
    SCOPED_TRACE(std::to_string(heads) + " pairs, T " + std::to_string(T));
    loads(persistent_forward_schedule(132, heads, T, 128, 128, true, false, true), heads, T, 128, true, false);
  }
  // More blocks than the table holds: the rounds alone.
  EXPECT_EQ(persistent_forward_schedule(200, 768, 1024, 128, 128, true, false, true).tail.rounds, INT32_MAX);
  // The knob.
  EXPECT_TRUE(cuda::attn::forward_tail_list(nullptr));
  EXPECT_TRUE(cuda::attn::forward_tail_list(""));
  EXPECT_TRUE(cuda::attn::forward_tail_list("auto"));
  EXPECT_FALSE(cuda::attn::forward_tail_list("off"));
  for (const char* bad : {"on", "0", "Auto"})
    test::expect_input_error([&] { cuda::attn::forward_tail_list(bad); }, {"FLASHGPT_ATTENTION_FWD_TAIL", bad});
}

// The claimed schedule's order (grouped_tile): every tile exactly once; one pair a group
// is the rounds' order; within a group rank by rank, each rank's pairs in order; a group
// never mixes pairs of two groups, and a short last group is ranked alone.
TEST(TileChoice, GroupedTilesVisitEveryTileOnceGroupByGroupLongestFirst) {
  using cuda::attn::grouped_tile;
  for (int heads : {1, 5, 12, 64})
    for (int m_blocks : {1, 3, 8})
      for (int group : {1, 2, 5, 12, 64, 100}) {
        SCOPED_TRACE(std::to_string(heads) + " pairs, " + std::to_string(m_blocks) + " tiles a pair, groups of " +
                     std::to_string(group));
        const int tiles = heads * m_blocks, g = std::min(group, heads);
        std::vector<int> seen(size_t(tiles), 0);
        for (int k = 0; k < tiles; ++k) {
          const int t = grouped_tile(k, heads, m_blocks, group);
          ASSERT_GE(t, 0);
          ASSERT_LT(t, tiles);
          ++seen[size_t(t)];
          const int bh = t / m_blocks, r = t % m_blocks;  // r: the rank (0: the pair's last query tile)
          const int group_index = k / (g * m_blocks), first = group_index * g, n = std::min(g, heads - first);
          EXPECT_EQ(bh / g, group_index) << "k " << k;  // its own group
          EXPECT_EQ(r, (k - group_index * g * m_blocks) / n) << "k " << k;
          EXPECT_EQ(bh, first + (k - group_index * g * m_blocks) % n) << "k " << k;
          if (g == 1) EXPECT_EQ(t, k);
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), tiles);
      }
  // 3 pairs of 2 tiles in one group: ranks 0 of pairs 0, 1, 2, then ranks 1.
  std::vector<int> order;
  for (int k = 0; k < 6; ++k) order.push_back(grouped_tile(k, 3, 2, 3));
  EXPECT_EQ(order, (std::vector<int>{0, 2, 4, 1, 3, 5}));
  // Groups of 2 over 3 pairs: pairs 0 and 1 rank by rank, then pair 2 alone.
  order.clear();
  for (int k = 0; k < 6; ++k) order.push_back(grouped_tile(k, 3, 2, 2));
  EXPECT_EQ(order, (std::vector<int>{0, 2, 1, 3, 4, 5}));
}

TEST(TileChoice, ForwardHeadGroupKnob) {
  using cuda::attn::forward_head_group;
  for (const char* unset : {static_cast<const char*>(nullptr), "", "auto"}) {
    // Under a causal mask from T = 2048 groups of 64, or all when fewer; up to 1K and
    // without a mask the rounds.
    EXPECT_EQ(forward_head_group(unset, 768, true, 2048), 64);
    EXPECT_EQ(forward_head_group(unset, 12, true, 16384), 12);
    EXPECT_EQ(forward_head_group(unset, 768, true, 1024), 0);
    EXPECT_EQ(forward_head_group(unset, 192, true, 512), 0);
    EXPECT_EQ(forward_head_group(unset, 768, true, 1025), 64);
    EXPECT_EQ(forward_head_group(unset, 768, false, 4096), 0);
    EXPECT_EQ(forward_head_group(unset, 12, false, 1024), 0);
  }
  for (bool causal : {true, false})  // a number asked for is taken with either mask, at any length
    for (int T : {1024, 4096}) {
      EXPECT_EQ(forward_head_group("0", 768, causal, T), 0);
      EXPECT_EQ(forward_head_group("5", 768, causal, T), 5);
      EXPECT_EQ(forward_head_group("1000", 768, causal, T), 768);  // no more than the pairs
      EXPECT_EQ(forward_head_group("all", 768, causal, T), 768);
    }
  for (const char* bad : {"-1", "x", "1.5", " 2", "2 ", "Auto"}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    test::expect_input_error([&] { forward_head_group(bad, 768, true, 2048); },
                             {"FLASHGPT_ATTENTION_FWD_HEAD_GROUP", bad});
  }
}

// Which tiles have a persistent kernel: what the launch builds and the rule may ask for.
TEST(TileChoice, Sm90wsPersistentKernelsAreTheTilesOf128Keys) {
  using cuda::attn::kSm90WsOneConsumer;
  using cuda::attn::sm90ws_block_n;
  using cuda::attn::sm90ws_consumers;
  using cuda::attn::sm90ws_has_persistent_kernel;
  EXPECT_EQ(sm90ws_consumers(0, 64), 2);
  EXPECT_EQ(sm90ws_consumers(0, 128), 2);
  EXPECT_EQ(sm90ws_consumers(1, 64), 3);
  EXPECT_EQ(sm90ws_consumers(1, 128), 2);
  for (int D : {64, 128}) EXPECT_EQ(sm90ws_consumers(kSm90WsOneConsumer, D), 1);
  EXPECT_EQ(sm90ws_block_n(0, 64), 128);
  EXPECT_EQ(sm90ws_block_n(0, 128), 128);
  EXPECT_EQ(sm90ws_block_n(1, 64), 128);
  EXPECT_EQ(sm90ws_block_n(1, 128), 176);
  EXPECT_EQ(sm90ws_block_n(kSm90WsOneConsumer, 64), 128);
  EXPECT_EQ(sm90ws_block_n(kSm90WsOneConsumer, 128), 64);
  EXPECT_FALSE(sm90ws_has_persistent_kernel(1, 128));
  EXPECT_TRUE(sm90ws_has_persistent_kernel(2, 128));
  EXPECT_FALSE(sm90ws_has_persistent_kernel(2, 176));
  EXPECT_TRUE(sm90ws_has_persistent_kernel(3, 128));
  // Only the three-consumer persistent kernel claims its tiles.
  using cuda::attn::sm90ws_claims_tiles;
  EXPECT_TRUE(sm90ws_claims_tiles(sm90ws_consumers(1, 64)));
  EXPECT_FALSE(sm90ws_claims_tiles(sm90ws_consumers(0, 64)));
  EXPECT_FALSE(sm90ws_claims_tiles(sm90ws_consumers(0, 128)));
  EXPECT_FALSE(sm90ws_claims_tiles(sm90ws_consumers(kSm90WsOneConsumer, 64)));
}

TEST(TileChoice, Sm90wsScheduleRejectsUnknownValues) {
  for (const char* bad : {"Persistent", "grid ", "1", "on"})
    EXPECT_THROW(cuda::attn::parse_forward_schedule(bad), InputError) << bad;
}

}  // namespace
}  // namespace flashgpt
