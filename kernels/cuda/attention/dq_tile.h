// The sm90 backward's TMA dQ tile (flash_bwd_sm90.cu, tma and owner modes): a query
// tile's fp32 dQ partial in shared memory as the TMA reads it, in boxes of 64 rows × 32
// columns, box (row / 64)·(D / 32) + column / 32, each box row 128 bytes whose 16-byte
// chunks are XOR-swizzled by row % 8 (the TMA's 128-byte swizzle). And where each thread
// of a warpgroup stores its registers there. Host and device, so that the CPU tests
// check the kernel's store addresses against the layout (tests/test_dq_tile.cpp).
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define FG_DQ_TILE_FN __host__ __device__ __forceinline__ constexpr
#else
#define FG_DQ_TILE_FN inline constexpr
#endif

namespace flashgpt::cuda::attn::dq_tile {

constexpr int kBoxRows = 64, kBoxCols = 32;
constexpr int kRowBytes = kBoxCols * 4, kBoxBytes = kBoxRows * kRowBytes;

// Byte offset of element (query row r, column c) in the tile of head dim D.
FG_DQ_TILE_FN uint32_t offset(int r, int c, int D) {
  const int row = r % kBoxRows, chunk = (c % kBoxCols) / 4;
  return uint32_t(((r / kBoxRows) * (D / kBoxCols) + c / kBoxCols) * kBoxBytes + row * kRowBytes +
                  ((chunk ^ (row % 8)) << 4) + (c % 4) * 4);
}

// A warpgroup's 64×64 block of the tile starts at query row q0 and column d0; thread
// (g, t) = (lane / 4, lane % 4) of its warp w (0..3).

// dQᵀ (the kernel computes dQᵀ = Kᵀ·dSᵀ, in tma and owner modes): register dq[j][2h + e]
// is column c = d0 + 16w + 8h + g of query row q0 + 8j + 2t + e: box (q0 / 64)·(D / 32) +
// c / 32, row 8j + 2t + e (row % 8 = 2t + e), chunk (c % 32) / 4 XOR (2t + e), byte
// 4·(g % 4). (c % 32) / 4 = 4·((c / 16) % 2) + 2h + g / 4, whose bit 1 is 2h's alone, so
// the chunk is x XOR (2h + e) with x = ((c0 % 32) / 4) XOR 2t (c0: h = 0): one address a
// thread (lane_base, with x) plus offsets (transposed_offset; j: 8 rows, + 8j·kRowBytes).
// One register of a warp is then 4 rows of 8 consecutive columns: 8 different chunks, all
// 32 banks, one wavefront. (dQ's own layout, 8 rows × 4 column pairs a register, took 4
// wavefronts a float2 store: a half warp's rows 0..3 met 16 banks; BENCHMARKS.md,
// "Twenty-sixth session".)
struct Transposed {
  uint32_t lane_base;  // bytes from the tile
  int x;
};
FG_DQ_TILE_FN Transposed transposed(int D, int q0, int d0, int w, int g, int t) {
  const int c0 = d0 + 16 * w + g;
  return {uint32_t(((q0 / 64) * (D / kBoxCols) + c0 / kBoxCols) * kBoxBytes + 2 * t * kRowBytes + (c0 & 3) * 4),
          ((c0 % kBoxCols) >> 2) ^ (2 * t)};
}
FG_DQ_TILE_FN uint32_t transposed_offset(int x, int h, int e) { return e * kRowBytes + ((x ^ (2 * h + e)) << 4); }

// The flat tile (flat mode): each warpgroup's block of dQᵀ in the order of its registers,
// not as the TMA boxes: register quad j (dq[j][0..3]) of thread i (0..127 in the
// warpgroup) at floats (j·128 + i)·4 of the block, warpgroup 0's block first. A block is
// 64 query rows × 64 columns at D = 64 (the tile split along the queries, 8 quads a
// thread) and BM rows × 64 columns at D = 128 (split along the head dim, BM / 8 quads:
// BM = 64 or, without a mask, 80). A warp's st.shared.v4 of quad j then writes 512
// consecutive bytes (four wavefronts, no bank met twice: a quarter of the instructions of
// the transposed stores above), and the whole tile goes to the accumulator in one bulk
// reduce-add. The accumulator keeps that order: BM·D floats a (batch·head, query tile),
// which the postprocess reads back through flat_element.
FG_DQ_TILE_FN int flat_block_floats(int D, int BM) { return (D == 64 ? 64 : BM) * 64; }
FG_DQ_TILE_FN int flat_index(int i, int j) { return (j * 128 + i) * 4; }
struct Element {
  int q, c;  // query row within the tile, column
};
// Where float f of a flat tile of head dim D and BM query rows belongs (dQᵀ's register
// dq[j][2h + e] of thread (w, g, t) is column d0 + 16w + 8h + g of query row q0 + 8j + 2t
// + e, as above).
FG_DQ_TILE_FN Element flat_element(int f, int D, int BM) {
  const int block_floats = flat_block_floats(D, BM);
  const int block = f / block_floats, rest = f % block_floats;
  const int r = rest % 4, i = (rest / 4) % 128, j = rest / 512;
  const int w = i / 32, g = (i % 32) / 4, t = i % 4;
  const int q0 = D == 64 ? 64 * block : 0, d0 = D == 64 ? 0 : 64 * block;
  return {q0 + 8 * j + 2 * t + (r & 1), d0 + 16 * w + 8 * (r >> 1) + g};
}

}  // namespace flashgpt::cuda::attn::dq_tile

#undef FG_DQ_TILE_FN
