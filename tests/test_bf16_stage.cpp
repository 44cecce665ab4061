// The staged epilogues' bf16 stage (kernels/cuda/attention/bf16_stage.h), on the CPU: the
// address each lane's stmatrix writes, against the stage's layout as a TMA store reads it,
// for both head dims, and that no matrix of a stmatrix meets a bank twice. The GPU tests
// (Cuda/FlashAttentionVsReference) check the values the kernels store this way (the sm90ws
// forward's O, the sm90 backward's dK and dV at D = 64); these check the arithmetic.
#include <gtest/gtest.h>
#include <set>
#include <vector>
#include "kernels/cuda/attention/bf16_stage.h"

namespace flashgpt {
namespace {

namespace bf16_stage = cuda::attn::bf16_stage;
constexpr uint32_t kBlockBytes = 64 * 128;  // a column block: 64 rows × 64 bf16

TEST(Bf16Stage, LayoutIsTheTmaBoxWith128ByteSwizzle) {
  for (int D : {64, 128}) {
    std::set<uint32_t> seen;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < D; ++c) {
        const uint32_t at = bf16_stage::offset(r, c, kBlockBytes);
        // The box of column block c / 64: row r's 128 bytes at 128·r, its 16-byte chunk
        // (c % 64) / 8 at that chunk XOR r % 8, two bytes an element.
        const uint32_t in_block = at % kBlockBytes;
        EXPECT_EQ(at / kBlockBytes, uint32_t(c / 64));
        EXPECT_EQ(in_block / 128, uint32_t(r));
        EXPECT_EQ(((in_block % 128) / 16) ^ uint32_t(r % 8), uint32_t((c % 64) / 8));
        EXPECT_EQ(in_block % 16, uint32_t((c % 8) * 2));
        seen.insert(at);
      }
    EXPECT_EQ(seen.size(), size_t(64 * D)) << "every element its own two bytes, D = " << D;
  }
}

TEST(Bf16Stage, EachLanesRowsLandOnTheirElementsAndAMatrixMeets32Banks) {
  for (int D : {64, 128})
    for (int w = 0; w < 4; ++w)
      for (int j = 0; j < D / 8; j += 2) {
        std::vector<uint32_t> address(32);
        for (int lane = 0; lane < 32; ++lane)
          address[size_t(lane)] = bf16_stage::pair_address(bf16_stage::lane_offset(w, lane), j, kBlockBytes);
        for (int m = 0; m < 4; ++m) {
          // Matrix m: rows 16w + 8·(m & 1).. of the accumulator's 8-column tile j + (m >> 1);
          // lane 8m + i gives its row i, whose eight elements are 16 contiguous bytes.
          std::set<uint32_t> banks;
          for (int i = 0; i < 8; ++i) {
            const int row = 16 * w + 8 * (m & 1) + i, col = 8 * (j + (m >> 1));
            const uint32_t at = address[size_t(8 * m + i)];
            EXPECT_EQ(at, bf16_stage::offset(row, col, kBlockBytes)) << "D " << D << " w " << w << " j " << j << " m " << m;
            for (int e = 0; e < 8; ++e)
              EXPECT_EQ(at + 2 * e, bf16_stage::offset(row, col + e, kBlockBytes));
            for (uint32_t word = 0; word < 4; ++word) banks.insert((at / 4 + word) % 32);
          }
          EXPECT_EQ(banks.size(), 32u) << "a matrix of 8 rows × 16 bytes in one wavefront (D " << D << ", j " << j << ")";
        }
      }
}

}  // namespace
}  // namespace flashgpt
