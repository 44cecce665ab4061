// The bf16 output stage of the Hopper attention kernels' staged epilogues
// (sm90::stage_accumulator_bf16 in wgmma_sm90.cuh: the sm90ws forward's O, the sm90
// backward's dK and dV): 64 rows of a wgmma accumulator in shared memory as a
// TMA store reads them, column blocks of 64 rows × 64 bf16 (128-byte rows) `block_bytes`
// apart, each row's 16-byte chunk c at c ^ (row % 8) (the TMA's 128-byte swizzle; the
// stage 1024-byte aligned). And where each lane's stmatrix writes there. Host and device,
// so that the CPU tests check the kernel's addresses against the layout
// (tests/test_bf16_stage.cpp).
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define FG_BF16_STAGE_FN __host__ __device__ __forceinline__ constexpr
#else
#define FG_BF16_STAGE_FN inline constexpr
#endif

namespace flashgpt::cuda::attn::bf16_stage {

// Byte offset of element (row r, column c) of the stage.
FG_BF16_STAGE_FN uint32_t offset(int r, int c, uint32_t block_bytes) {
  return (c / 64) * block_bytes + uint32_t(r * 128) + uint32_t((((c % 64) / 8) ^ (r % 8)) << 4) + uint32_t((c % 8) * 2);
}

// stmatrix .x4 writes four 8×8 matrices: lane l gives the address of row l % 8 of matrix
// l / 8, and register m of every lane holds matrix m in the accumulator's fragment layout
// (row lane / 4, columns 2(lane % 4), +1). The epilogue's matrices for the accumulator's
// 8-column tiles j and j + 1 (j even) of warp w (rows 16w..16w + 15): matrix m is rows
// 16w + 8·(m & 1).. of tile j + (m >> 1). Lane l's address for pair j, from lane_offset
// (once a thread) by pair_address: row 16w + (l & 15) has swizzle l % 8, and the tile's
// parity l / 16 is the low bit of its chunk, which the pair's chunk (j % 8, even) leaves
// alone, so chunk ^ swizzle = (j % 8) ^ (l / 16) ^ (l % 8): one XOR with a constant a pair.
FG_BF16_STAGE_FN uint32_t lane_offset(int w, int lane) {
  return uint32_t((16 * w + (lane & 15)) * 128 + (((lane >> 4) ^ (lane & 7)) << 4));
}
// `lane_address`: the stage's address (1024-byte aligned) plus lane_offset.
FG_BF16_STAGE_FN uint32_t pair_address(uint32_t lane_address, int j, uint32_t block_bytes) {
  return (lane_address + uint32_t(j / 8) * block_bytes) ^ uint32_t((j % 8) << 4);
}

}  // namespace flashgpt::cuda::attn::bf16_stage

#undef FG_BF16_STAGE_FN
