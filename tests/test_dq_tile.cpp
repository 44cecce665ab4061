// The sm90 backward's dQ tile (kernels/cuda/attention/dq_tile.h), on the CPU: the address
// every thread of the kernel stores each register at, against the tile's layout as the
// TMA reads it, for both head dims, and that no warp store meets a bank twice (the
// kernel stores dQᵀ in tma and owner modes); and the flat tile's register order against
// the element each float stands for (flat mode, and its postprocess). The GPU tests
// (Cuda/FlashAttentionVsReference) check the values; these check the arithmetic the bank
// analysis rests on.
#include <gtest/gtest.h>
#include <set>
#include <vector>
#include "kernels/cuda/attention/dq_tile.h"

namespace flashgpt {
namespace {

namespace dq_tile = cuda::attn::dq_tile;

// The kernel's two warpgroups: their 64×64 blocks of the BM × D tile (BM = 128 at D = 64,
// split along the queries; BM = 64 at D = 128, split along the columns).
struct Block {
  int q0, d0;
};
std::vector<Block> blocks(int D) {
  if (D == 64) return {{0, 0}, {64, 0}};
  return {{0, 0}, {0, 64}};
}

TEST(DqTile, LayoutIsTheTmaBoxesWith128ByteSwizzle) {
  // Box (r / 64)·(D / 32) + c / 32, 128-byte rows, 16-byte chunk index XOR row % 8.
  EXPECT_EQ(dq_tile::offset(0, 0, 64), 0u);
  EXPECT_EQ(dq_tile::offset(0, 4, 64), 16u);
  EXPECT_EQ(dq_tile::offset(1, 0, 64), 128u + 16u);       // row 1: chunk 0 XOR 1
  EXPECT_EQ(dq_tile::offset(7, 31, 64), 7u * 128 + ((7u ^ 7u) << 4) + 12u);
  EXPECT_EQ(dq_tile::offset(0, 32, 64), 8192u);           // the second box of the row block
  EXPECT_EQ(dq_tile::offset(64, 0, 64), 2u * 8192);       // the second row block at D = 64
  EXPECT_EQ(dq_tile::offset(0, 96, 128), 3u * 8192);
  for (int D : {64, 128}) {  // a bijection onto the tile's bytes, 4 apart
    const int rows = D == 64 ? 128 : 64;
    std::set<uint32_t> seen;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < D; ++c) {
        const uint32_t a = dq_tile::offset(r, c, D);
        EXPECT_EQ(a % 4, 0u);
        EXPECT_LT(a, uint32_t(rows * D * 4));
        EXPECT_TRUE(seen.insert(a).second) << "D " << D << " row " << r << " column " << c;
      }
  }
}

TEST(DqTile, TransposedStoresLandOnTheirElementsAndMeet32Banks) {
  for (int D : {64, 128}) {
    std::set<uint32_t> seen;
    for (const Block& b : blocks(D))
      for (int w = 0; w < 4; ++w)
        for (int h = 0; h < 2; ++h)
          for (int e = 0; e < 2; ++e)
            for (int j = 0; j < 8; ++j) {
              std::set<int> banks;  // one warp store: register dq[j][2h + e] of every lane
              for (int lane = 0; lane < 32; ++lane) {
                const int g = lane / 4, t = lane % 4;
                const dq_tile::Transposed l = dq_tile::transposed(D, b.q0, b.d0, w, g, t);
                const uint32_t a = l.lane_base + dq_tile::transposed_offset(l.x, h, e) + j * 8 * dq_tile::kRowBytes;
                const int query = b.q0 + 8 * j + 2 * t + e, column = b.d0 + 16 * w + 8 * h + g;
                ASSERT_EQ(a, dq_tile::offset(query, column, D))
                    << "D " << D << " warp " << w << " lane " << lane << " h " << h << " e " << e << " j " << j;
                EXPECT_TRUE(seen.insert(a).second);
                banks.insert(int(a / 4 % 32));
              }
              EXPECT_EQ(banks.size(), 32u) << "D " << D << " warp " << w << " h " << h << " e " << e << " j " << j;
            }
    EXPECT_EQ(seen.size(), size_t(D == 64 ? 128 : 64) * D);
  }
}

// Flat mode: the float each thread's register quad goes to, and back (the postprocess's
// flat_element), for every register; every element of the tile once; a warp's v4 store
// of one quad covers 512 consecutive bytes. For each tile of the kernel: D = 64 with 128
// query rows, D = 128 with 64 and (without a mask) 80.
TEST(DqTile, FlatTileHoldsEveryElementOnceInRegisterOrder) {
  for (auto [D, rows] : {std::pair<int, int>{64, 128}, {128, 64}, {128, 80}}) {
    const int quads = D == 64 ? 8 : rows / 8;  // dq[j] a thread: 64 or BM query rows of its block
    EXPECT_EQ(dq_tile::flat_block_floats(D, rows), quads * 128 * 4);
    std::set<std::pair<int, int>> seen;
    for (int wg = 0; wg < 2; ++wg) {
      const Block b = blocks(D)[size_t(wg)];
      for (int i = 0; i < 128; ++i) {
        const int w = i / 32, g = (i % 32) / 4, t = i % 4;
        for (int j = 0; j < quads; ++j)
          for (int r = 0; r < 4; ++r) {
            const int f = wg * dq_tile::flat_block_floats(D, rows) + dq_tile::flat_index(i, j) + r;
            const dq_tile::Element e = dq_tile::flat_element(f, D, rows);
            // dQᵀ's register dq[j][2h + e]: column d0 + 16w + 8h + g of query row q0 + 8j + 2t + e.
            ASSERT_EQ(e.q, b.q0 + 8 * j + 2 * t + (r & 1)) << "D " << D << " thread " << i << " j " << j << " r " << r;
            ASSERT_EQ(e.c, b.d0 + 16 * w + 8 * (r >> 1) + g) << "D " << D << " thread " << i << " j " << j << " r " << r;
            ASSERT_LT(e.q, rows);
            ASSERT_LT(e.c, D);
            EXPECT_TRUE(seen.insert({e.q, e.c}).second);
          }
        if (i % 32 == 0)  // a warp's store of quad j: lanes 16 bytes apart
          for (int j = 0; j < quads; ++j) EXPECT_EQ(dq_tile::flat_index(i + 31, j) - dq_tile::flat_index(i, j), 31 * 4);
      }
    }
    EXPECT_EQ(seen.size(), size_t(rows) * D);
  }
}

}  // namespace
}  // namespace flashgpt
