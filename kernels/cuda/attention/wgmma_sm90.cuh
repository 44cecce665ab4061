// Hopper (sm_90a) warpgroup MMA building blocks for the attention forward and backward:
// shared-memory matrix descriptors for 128-byte-swizzled tiles, and wgmma.mma_async wrappers
// (m64nNk16, bf16 inputs, fp32 accumulators) for the shapes the kernels use.
//
// Tile layout ("wgmma layout"): a (rows x D) bf16 tile is stored as D/64 column blocks of
// (rows x 64); each row of a block is 128 bytes whose 16-byte chunks are XOR-ed with
// (row % 8). Every block starts 1024-byte aligned. This is the canonical 128B-swizzle
// layout of the PTX ISA (section "Shared Memory Matrix Layout"): K-major when the
// 64 contiguous elements are the reduction dimension (Q, K), MN-major when they are the
// output dimension (V in O = P·V, used with the transpose flag).
//
// Accumulator layout of m64nN: warp w of the warpgroup holds rows 16w..16w+15, and
// within a warp d[j][0..3] is exactly the mma.sync m16n8 C fragment of columns 8j..8j+7;
// the register A operand has the mma.sync A-fragment layout. So the softmax code of the
// sm80 path applies per warp unchanged.
#pragma once
#include <cstdint>
#include "kernels/cuda/attention/bf16_stage.h"
#include "kernels/cuda/attention/sm80_primitives.cuh"

// wgmma exists only in the sm_90a target; other targets compile a stub.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHGPT_HAS_WGMMA 1
#else
#define FLASHGPT_HAS_WGMMA 0
#endif

namespace flashgpt::cuda::attn::sm90 {

// Element offset of (row, col) in a wgmma-layout tile of kRows rows.
template <int kRows>
__device__ __forceinline__ int tile_offset(int row, int col) {
  return (col >> 6) * (kRows * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// Copies rows [row0, row0 + kRows) x kCols of a (T, row_stride) bf16 matrix into a
// wgmma-layout tile with kThreads threads (tid: 0..kThreads - 1); rows >= T become zeros.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* src, int64_t row_stride,
                                                int row0, int T, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
    const bool in_range = row0 + r < T;
    const bf16* g = src + int64_t(in_range ? row0 + r : 0) * row_stride + c;
    cp_async_16(smem_u32(tile + tile_offset<kRows>(r, c)), g, in_range);
  }
}

// 8 rows of 128 bytes: one swizzle atom, the stride-dimension offset of every descriptor here.
constexpr uint32_t kSwizzleAtom = 8 * 128;

// Shared-memory matrix descriptor, 128-byte swizzle. lbo/sbo: leading/stride byte
// offsets as the PTX ISA defines them for the operand's major-ness.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (smem_addr & 0x3FFFFu) >> 4;
  d |= uint64_t((lbo >> 4) & 0x3FFFu) << 16;
  d |= uint64_t((sbo >> 4) & 0x3FFFu) << 32;
  d |= uint64_t(1) << 62;  // swizzle mode 1 = 128B
  return d;
}
// make_desc(smem_addr + bytes, lbo, sbo) from make_desc(smem_addr, lbo, sbo), for `bytes` a
// multiple of 16: one 32-bit add to the start-address field (address / 16, bits 0-13),
// which never carries out of it because every shared-memory address of a block is below
// 2^18 (the mask in make_desc). A loop of wgmmas then builds one descriptor per operand
// and adds compile-time offsets, instead of masking, shifting and or-ing every address
// (about 8 uniform-datapath instructions a wgmma, a quarter of the backward's
// instructions in ncu).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4), hi = uint32_t(desc >> 32);
  return (uint64_t(hi) << 32) | lo;
}

// Four 8x8 b16 matrices from registers into shared memory (stmatrix, sm_90): register j of
// every lane goes to matrix j, at the place the mma fragment layout gives it (row lane/4,
// columns 2(lane%4), +1); lanes 8j..8j+7 give the addresses of matrix j's 8 rows (16
// bytes each). One instruction where four 32-bit stores would be.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
// A warp's 16 rows of an m64nN fp32 wgmma accumulator (acc[j][i]: row 16·warp + lane/4
// (+ 8 for i ≥ 2), columns 8j + 2(lane%4) + i%2), rows lane/4 times scale_lo and rows
// lane/4 + 8 times scale_hi, → bf16 into a 64-row stage in shared memory at `tile`, laid
// out as a TMA store reads it (bf16_stage.h: N/64 column blocks of 64 rows × 128 bytes,
// `block_bytes` apart, 1024-byte aligned, 128-byte swizzle). One stmatrix writes two
// 8-column tiles; the eight lanes of a matrix write eight rows whose chunks the swizzle
// spreads over the 32 banks (tests/test_bf16_stage.cpp checks both).
template <int kTiles>
__device__ __forceinline__ void stage_accumulator_bf16(uint32_t tile, uint32_t block_bytes, int warp, int lane,
                                                       const float (&acc)[kTiles][4], float scale_lo,
                                                       float scale_hi) {
  static_assert(kTiles % 8 == 0, "whole 64-column blocks");
  const uint32_t lane_addr = tile + bf16_stage::lane_offset(warp, lane);
#pragma unroll
  for (int j = 0; j < kTiles; j += 2) {
    const uint32_t r[4] = {pack_bf16(acc[j][0] * scale_lo, acc[j][1] * scale_lo),
                           pack_bf16(acc[j][2] * scale_hi, acc[j][3] * scale_hi),
                           pack_bf16(acc[j + 1][0] * scale_lo, acc[j + 1][1] * scale_lo),
                           pack_bf16(acc[j + 1][2] * scale_hi, acc[j + 1][3] * scale_hi)};
    stmatrix_x4(bf16_stage::pair_address(lane_addr, j, block_bytes), r);
  }
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Makes this thread's generic-proxy writes to shared memory (cp.async, st.shared)
// visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D (64 x 128, fp32) (+)= A (64 x 16, smem) * B (16 x 128, smem, K-major).
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// D (64 x 176, fp32) (+)= A (64 x 16, smem) * B (16 x 176, smem, K-major): the forward's
// S = Q·Kᵀ with 176-key tiles (FlashAttention-3's tile at head dim 128 without a mask).
__device__ __forceinline__ void wgmma_ss_n176(float (&d)[22][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
        "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
        "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
        "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
        "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// D (64 x 64, fp32) += A (64 x 16, registers) * B (16 x 64, smem, MN-major: stored [k][n]).
__device__ __forceinline__ void wgmma_rs_n64_tb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
// D (64 x 128, fp32) += A (64 x 16, registers) * B (16 x 128, smem, MN-major: stored [k][n]).
__device__ __forceinline__ void wgmma_rs_n128_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// D (64 x 64, fp32) (+)= A (64 x 16, smem) * B (16 x 64, smem) with per-operand major-ness:
// kTransA / kTransB = 1 when that operand is MN-major (stored [k][m] / [k][n], the 64
// contiguous elements along M / N), 0 when K-major (wgmma_ss<64>: both). The backward's
// dQ = dS·K reads dS from a [key][query] tile and K from a [key][d] tile: both MN-major.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss_n64_t(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// D (64 x 80, fp32) (+)= A (64 x 16, smem) * B (16 x 80, smem), major-ness as
// wgmma_ss_n64_t's: the backward's Sᵀ and dPᵀ (both K-major) and dQᵀ (both MN-major) with
// 80-query tiles (D = 128 without a mask, FlashAttention-3's tile there).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss_n80_t(float (&d)[10][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, 1, %43, %44;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// Keeps the compiler from moving reads of wgmma accumulators across the wait (the asm
// statements do not tell it that the registers change asynchronously).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
}

// Returns x, but the compiler cannot see that: a value laundered inside a loop is
// recomputed there instead of being kept in registers across it. The backward uses it on
// the loop-invariant tile addresses whose descriptors would otherwise be hoisted out of
// the query loop and spilled at D = 128 (ptxas: 255 registers and 20-24 bytes of spills
// without it, 254 and none with it; scripts/ptxas_report.sh --strict checks this).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}
// x as lane 0 of the warp has it: the compiler then treats it as the same in every lane
// (CUTLASS makes its warp-group index warp-uniform the same way), so that branches on it,
// around wgmmas too, are known to be warp-uniform. The sm90ws forward's three-consumer
// index and the D = 128 backward's warp index come through it.
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

#if FLASHGPT_HAS_WGMMA
// wgmma_ss with each operand's major-ness (kTransA / kTransB: 1 = MN-major), N = 64 or 80.
template <int N, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss_t(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {
  static_assert(N == 64 || N == 80, "wgmma_ss_t: N = 64 or 80");
  if constexpr (N == 64) wgmma_ss_n64_t<kTransA, kTransB>(d, a, b, accumulate);
  else wgmma_ss_n80_t<kTransA, kTransB>(d, a, b, accumulate);
}
// Both operands K-major.
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {
  static_assert(N == 64 || N == 80 || N == 128 || N == 176, "wgmma_ss: N = 64, 80, 128 or 176");
  if constexpr (N == 64 || N == 80) wgmma_ss_t<N, 0, 0>(d, a, b, accumulate);
  else if constexpr (N == 128) wgmma_ss_n128(d, a, b, accumulate);
  else wgmma_ss_n176(d, a, b, accumulate);
}
template <int N>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (N == 64) wgmma_rs_n64_tb(d, a, b);
  else wgmma_rs_n128_tb(d, a, b);
}
// acc = A·Bᵀ over D columns for one warpgroup, issued and committed: A's 64 rows at a_base
// (column block 0 of a [D/64][kRowsA][64] tile) and B's kRowsB rows at b_base ([D/64]
// [kRowsB][64]), both K-major and 128-byte swizzled; k-step kk is 16 columns = 32 bytes
// into column block kk/4. The forward's S = Q·Kᵀ and the backward's Sᵀ = K·Qᵀ.
template <int D, int kRowsA, int kRowsB>
__device__ __forceinline__ void issue_abt(float (&acc)[kRowsB / 8][4], uint32_t a_base, uint32_t b_base) {
  const uint64_t desc_a = make_desc(a_base, 16, kSwizzleAtom), desc_b = make_desc(b_base, 16, kSwizzleAtom);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col_bytes = (kk & 3) * 32;
    wgmma_ss<kRowsB>(acc, desc_advance(desc_a, (kk >> 2) * kRowsA * 128 + col_bytes),
                     desc_advance(desc_b, (kk >> 2) * kRowsB * 128 + col_bytes), /*accumulate=*/kk > 0);
  }
  wgmma_commit();
}
#endif

}  // namespace flashgpt::cuda::attn::sm90
