// Warp-level building blocks of the portable (sm_80+) FlashAttention path: 16-byte
// async copies into swizzled shared-memory tiles, ldmatrix fragment loads and the
// m16n8k16 bf16 tensor-core MMA with fp32 accumulation.
//
// Fragment layouts of mma.sync.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16, row-major) a[0]: (g, 2t..2t+1)   a[1]: (g+8, 2t..)   a[2]: (g, 2t+8..)  a[3]: (g+8, 2t+8..)
//   B (16x8,  "col")     b[0]: (k=2t..2t+1, n=g)                   b[1]: (k=2t+8.., n=g)
//   C (16x8,  fp32)      c[0..1]: (g, 2t..2t+1)                     c[2..3]: (g+8, 2t..2t+1)
// A C fragment pair (16 x 16 columns) therefore *is* an A fragment once packed to bf16:
// that is how P = softmax(S) feeds the next MMA without touching shared memory.
//
// Shared-memory tiles hold rows of `cols` bf16 (cols = 64 or 128, i.e. 128 or 256 bytes),
// in 16-byte chunks whose index is XOR-ed with (row % 8). Without it the 8 row addresses
// of one ldmatrix 8x8 matrix all fall in the same 4 banks (row stride is a multiple of
// 128 bytes): an 8-way conflict. With it they cover all 32 banks.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>
#include "kernels/cuda/attention/flash_params.h"

namespace flashgpt::cuda::attn {

using bf16 = __nv_bfloat16;


__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of (row, 16-byte chunk) in a swizzled tile with `kCols` bf16 per row.
template <int kCols>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kCols % 64 == 0, "swizzle needs at least 8 chunks of 16 bytes per row");
  return row * kCols + ((chunk ^ (row & 7)) << 3);
}

// ---- async copies --------------------------------------------------------------
// cp.async with src-size 0 writes zeros and reads nothing: the predicate for rows >= T.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// 4 bytes (a float): cp.async.ca, the only variant below 16 bytes; src-size 0 writes 0.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Copies rows [row0, row0 + kRows) x kCols of a (T, row_stride) bf16 matrix into a
// swizzled tile; rows >= T become zeros.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* src, int64_t row_stride,
                                                int row0, int T, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    const bool in_range = row0 + r < T;
    // Clamp the address even when nothing is read, so it never points past the tensor.
    const bf16* g = src + int64_t(in_range ? row0 + r : 0) * row_stride + c * 8;
    cp_async_16(smem_u32(tile + swizzle<kCols>(r, c)), g, in_range);
  }
}

// ---- ldmatrix fragment loads ----------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A fragment (16 rows from m0, k-step columns 16*kk..) of a row-major [m][k] tile.
template <int kCols>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int m0, int kk, int lane) {
  const int row = m0 + (lane & 15);
  const int chunk = kk * 2 + (lane >> 4);
  ldmatrix_x4(a, smem_u32(tile + swizzle<kCols>(row, chunk)));
}
// A fragment of A = Xᵀ where the tile stores X as [k][m] (m0: first A row, k0: first k).
template <int kCols>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* tile, int m0, int k0,
                                             int lane) {
  const int mat = lane >> 3;
  const int row = k0 + (mat >> 1) * 8 + (lane & 7);
  const int chunk = (m0 >> 3) + (mat & 1);
  ldmatrix_x4_trans(a, smem_u32(tile + swizzle<kCols>(row, chunk)));
}
// B fragments of two n-tiles (columns n0..n0+15) for k-step kk, when the tile stores
// Bᵀ as [n][k] (K for Q·Kᵀ). b[0], b[1]: n-tile 0; b[2], b[3]: n-tile 1.
template <int kCols>
__device__ __forceinline__ void load_b_pair(uint32_t (&b)[4], const bf16* tile, int n0, int kk,
                                            int lane) {
  const int row = n0 + (lane >> 4) * 8 + (lane & 7);
  const int chunk = kk * 2 + ((lane >> 3) & 1);
  ldmatrix_x4(b, smem_u32(tile + swizzle<kCols>(row, chunk)));
}
// Same, when the tile stores B itself as [k][n] (V for P·V): rows k0.., columns n0..n0+15.
template <int kCols>
__device__ __forceinline__ void load_b_pair_trans(uint32_t (&b)[4], const bf16* tile, int k0,
                                                  int n0, int lane) {
  const int row = k0 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const int chunk = (n0 >> 3) + (lane >> 4);
  ldmatrix_x4_trans(b, smem_u32(tile + swizzle<kCols>(row, chunk)));
}

// ---- MMA ----------------------------------------------------------------------------
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

// Packs the fp32 C fragments of n-tiles 2kk and 2kk+1 into the A fragment of k-step kk.
__device__ __forceinline__ void c_pair_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                            const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// 2^x on the special-function unit; ex2(-inf) = +0, which is what masked scores need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 threads (a "quad") that share one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashgpt::cuda::attn
