// FlashAttention backward, portable path (sm_80+), by recomputation from the LSE.
//
// With S = Q·Kᵀ (raw), P = exp(S·scale − LSE) and D = rowsum(dO ∘ O):
//   dV = Pᵀ·dO        dP = dO·Vᵀ        dS = P ∘ (dP − D)
//   dK = scale·dSᵀ·Q  dQ = scale·dS·K
// Kernels, in launch order:
//   1. preprocess: D (B,H,T) fp32 into a.delta.
//   2. main: one block per K/V tile (kBlockN keys, 16 per warp) with dK, dV in registers,
//      looping over the query tiles that see it (causal: from the diagonal on). Each warp
//      computes Sᵀ and dPᵀ for its 16 keys, so Pᵀ and dSᵀ are already in the A-fragment
//      layout that dV += Pᵀ·dO and dK += dSᵀ·Q need.
//      Atomic mode (default): dSᵀ also goes to shared memory, and dQ += dS·K for this
//      key tile is added to an fp32 (B,H,T,D) workspace with float atomics;
//      3. postprocess: dQ·scale → bf16 into dqkv.
//   Deterministic mode (FLASHGPT_DETERMINISTIC=1): the main kernel skips dQ and
//      3'. a dQ kernel, one block per query tile, loops over the key tiles and
//      accumulates dQ in registers (recomputing S, P, dP once more): no atomics, the
//      same bits on every run.
#include <cmath>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/sm80_primitives.cuh"

namespace flashgpt::cuda::attn {
namespace {

// dst[0] += x, dst[1] += y. Hopper has an 8-byte vector atomic: half the instructions.
__device__ __forceinline__ void atomic_add_pair(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// ---- 1. preprocess: D = rowsum(dO ∘ O) -----------------------------------------------
// One thread per 8 elements (16 bytes) of a (b, t, h) row of O and of dO: D/8 threads a
// row, whose sum comes together by shuffles within those lanes. The same kernel zeroes
// the first zero_vec4 float4s of the dQ accumulator (when asked), spread over all its
// threads, so that the reads of O and dO and the accumulator's writes share one pass. (One
// warp a row reading 4-8 bytes a lane, with the zeroing a separate cudaMemsetAsync, took
// 47 µs + the memset at 16 × 16 × 1K D 128 and 85 µs at 16 × 32 × 1K D 64 on an H200, ncu:
// BENCHMARKS.md, "Thirty-fourth session".)
// The blocks run in reverse: block 0 takes the last rows and the last part of the
// accumulator, so that the first rows of dO and the first part of the accumulator, which
// the sm90 main kernel's first head group reads, are what the kernel touches last and
// are still in the L2 when that kernel starts; each warp zeroes one run of consecutive
// float4s for the same reason. Thread 0 of the last block also zeroes the sm90 backward's
// work counter (p.item_counter, when there is one), which took a memset launch of its own.
// With the flat postprocess's tiles in reverse too: 0.8-1.3% faster backward at T = 1K and
// 0.3-0.6% at 2K on an H200 (BENCHMARKS.md, "Forty-third session", call 2).
template <int kHeadDim>
__global__ void __launch_bounds__(256) flash_bwd_preprocess_kernel(const FlashParams p, int64_t zero_vec4) {
  constexpr int kLanesPerRow = kHeadDim / 8;
  static_assert(32 % kLanesPerRow == 0, "a row's lanes lie within one warp");
  const int64_t i = (int64_t(gridDim.x) - 1 - blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = i / kLanesPerRow;  // (b*T + t)*H + h
  const int part = int(i % kLanesPerRow);
  float acc = 0.f;
  const bool live = row < int64_t(p.B) * p.T * p.H;
  if (live) {
    const uint4 o = __ldg(reinterpret_cast<const uint4*>(p.out + row * kHeadDim) + part);
    const uint4 d = __ldg(reinterpret_cast<const uint4*>(p.dout + row * kHeadDim) + part);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = __bfloat1622float2(o2[k]), c = __bfloat1622float2(d2[k]);
      acc += a.x * c.x + a.y * c.y;
    }
  }
#pragma unroll
  for (int off = kLanesPerRow / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (live && part == 0) {
    const int h = int(row % p.H);
    const int64_t bt = row / p.H;
    const int t = int(bt % p.T), b = int(bt / p.T);
    p.delta[(int64_t(b) * p.H + h) * p.T + t] = acc;
  }
  if (i == 0 && p.item_counter) *p.item_counter = 0;
  // Warp w zeroes float4s [w·32·per, (w + 1)·32·per), 32 consecutive ones a store.
  const int64_t threads = int64_t(gridDim.x) * blockDim.x, per = (zero_vec4 + threads - 1) / threads;
  float4* acc4 = reinterpret_cast<float4*>(p.dq_accum);
  for (int64_t k = i / 32 * 32 * per + i % 32, end = k + 32 * per; k < end && k < zero_vec4; k += 32)
    acc4[k] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// ---- 2. main kernel ----------------------------------------------------------------------
template <int kHeadDim_, int kWarps_, int kBlockM_>
struct BwdTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;  // keys per block: 16 per warp
  static constexpr int kBlockM = kBlockM_;     // queries per inner step
  static constexpr int kMTiles = kBlockM / 8;  // 8-column tiles of Sᵀ (columns = queries)
  static constexpr int kDTiles = kHeadDim / 8;
  // dQ += dS·K is split over warps: (kBlockM/16) row tiles × kDqSplit column ranges.
  static constexpr int kDqRowTiles = kBlockM / 16;
  static constexpr int kDqSplit = kWarps / kDqRowTiles;
  static constexpr int kDqCols = kHeadDim / kDqSplit;
  static constexpr int kDqChunk = kDqCols < 32 ? kDqCols : 32;
  static constexpr size_t kSmemBytes =
      size_t(2 * kBlockN + 4 * kBlockM) * kHeadDim * sizeof(bf16)  // K, V, 2×Q, 2×dO
      + size_t(kBlockN) * kBlockM * sizeof(bf16)                    // dSᵀ
      + 4 * kBlockM * sizeof(float);                                // 2×LSE, 2×D
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockM == 64, "dSᵀ tile rows are 64 bf16 (one swizzle period of 128 bytes)");
  static_assert(kWarps % kDqRowTiles == 0 && kDqCols % kDqChunk == 0 && kDqChunk % 16 == 0,
                "dQ work splits evenly over warps");
};
// Two shapes per head dim (FLASHGPT_ATTENTION_BWD_TILE=0|1): 128 keys × 8 warps, one
// block per SM; or 64 keys × 4 warps, two blocks per SM and twice the blocks.
template <int kHeadDim> struct BwdConfig {
  using Tile0 = BwdTile<kHeadDim, /*kWarps=*/8, /*kBlockM=*/64>;
  using Tile1 = BwdTile<kHeadDim, /*kWarps=*/4, /*kBlockM=*/64>;
};

template <class Tile, bool kCausal, bool kAtomicDq>
__global__ void __launch_bounds__(Tile::kThreads, 1) flash_bwd_sm80_kernel(const FlashParams p) {
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);  // [BN][D]
  bf16* sV = sK + BN * D;                    // [BN][D]
  bf16* sQ = sV + BN * D;                    // [2][BM][D]
  bf16* sdO = sQ + 2 * BM * D;               // [2][BM][D]
  bf16* sdSt = sdO + 2 * BM * D;             // [BN][BM]  dSᵀ, keys × queries
  float* sLse = reinterpret_cast<float*>(sdSt + BN * BM);  // [2][BM]  LSE·log2(e)
  float* sDelta = sLse + 2 * BM;                            // [2][BM]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int n0 = n_block * BN;
  const int64_t bh = int64_t(b) * p.H + h;

  const bf16* q = p.qkv + int64_t(b) * p.T * p.qkv_row_stride + h * D;
  const bf16* k = q + int64_t(p.H) * D;
  const bf16* v = k + int64_t(p.H) * D;
  const bf16* dout = p.dout + int64_t(b) * p.T * p.o_row_stride + h * D;
  const float* lse = p.lse + bh * p.T;
  const float* delta = p.delta + bh * p.T;

  // Causal: queries before this tile's first key see none of it.
  const int m_begin = kCausal ? n0 / BM : 0;
  const int m_blocks = (p.T + BM - 1) / BM;

  auto load_q_tile = [&](int m, int buf) {
    load_tile_async<BM, D, Tile::kThreads>(sQ + buf * BM * D, q, p.qkv_row_stride, m * BM, p.T, tid);
    load_tile_async<BM, D, Tile::kThreads>(sdO + buf * BM * D, dout, p.o_row_stride, m * BM, p.T, tid);
    if (tid < BM) {  // plain loads: visible after the next __syncthreads
      const int row = m * BM + tid;
      sLse[buf * BM + tid] = row < p.T ? lse[row] * kLog2e : 0.f;
      sDelta[buf * BM + tid] = row < p.T ? delta[row] : 0.f;
    }
  };
  load_tile_async<BN, D, Tile::kThreads>(sK, k, p.qkv_row_stride, n0, p.T, tid);
  load_tile_async<BN, D, Tile::kThreads>(sV, v, p.qkv_row_stride, n0, p.T, tid);
  load_q_tile(m_begin, 0);
  cp_async_commit();

  float dk[Tile::kDTiles][4], dv[Tile::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[dt][i] = dv[dt][i] = 0.f;

  const int key_row0 = warp * 16;  // this warp's keys within the tile
  for (int m = m_begin; m < m_blocks; ++m) {
    const int buf = (m - m_begin) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (m + 1 < m_blocks) {
      load_q_tile(m + 1, buf ^ 1);
      cp_async_commit();
    }
    const bf16* cQ = sQ + buf * BM * D;
    const bf16* cdO = sdO + buf * BM * D;
    const float* cLse = sLse + buf * BM;
    const float* cDelta = sDelta + buf * BM;
    const int q0 = m * BM;

    // Sᵀ (16 keys × BM queries) = K·Qᵀ
    float s[Tile::kMTiles][4];
#pragma unroll
    for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a<D>(a, sK, key_row0, kk, lane);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        uint32_t bq[4];
        load_b_pair<D>(bq, cQ, np * 16, kk, lane);
        mma_16816(s[2 * np], a, bq[0], bq[1]);
        mma_16816(s[2 * np + 1], a, bq[2], bq[3]);
      }
    }

    // Mask: queries >= T, keys >= T, and (causal) keys after the query.
    const bool needs_mask = q0 + BM > p.T || n0 + BN > p.T || (kCausal && n0 + BN - 1 > q0);
    if (needs_mask) {
#pragma unroll
      for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = n0 + key_row0 + g + (i >> 1) * 8;
          const int qry = q0 + nt * 8 + 2 * t + (i & 1);
          if (qry >= p.T || key >= p.T || (kCausal && key > qry)) s[nt][i] = -INFINITY;
        }
    }
    // Pᵀ = exp2(S·scale·log2e − LSE·log2e)
#pragma unroll
    for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        s[nt][i] = fast_exp2(fmaf(s[nt][i], p.scale_log2, -cLse[nt * 8 + 2 * t + (i & 1)]));

    // dV += Pᵀ·dO
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t a[4];
      c_pair_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bo[4];
        load_b_pair_trans<D>(bo, cdO, kk * 16, dp * 16, lane);
        mma_16816(dv[2 * dp], a, bo[0], bo[1]);
        mma_16816(dv[2 * dp + 1], a, bo[2], bo[3]);
      }
    }

    // dPᵀ (16 keys × BM queries) = V·dOᵀ
    float ds[Tile::kMTiles][4];
#pragma unroll
    for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) ds[nt][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a<D>(a, sV, key_row0, kk, lane);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        uint32_t bo[4];
        load_b_pair<D>(bo, cdO, np * 16, kk, lane);
        mma_16816(ds[2 * np], a, bo[0], bo[1]);
        mma_16816(ds[2 * np + 1], a, bo[2], bo[3]);
      }
    }
    // dSᵀ = Pᵀ ∘ (dPᵀ − D)
#pragma unroll
    for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) ds[nt][i] = s[nt][i] * (ds[nt][i] - cDelta[nt * 8 + 2 * t + (i & 1)]);

    // dK += dSᵀ·Q (scale applied in the epilogue)
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t a[4];
      c_pair_to_a(a, ds[2 * kk], ds[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bq[4];
        load_b_pair_trans<D>(bq, cQ, kk * 16, dp * 16, lane);
        mma_16816(dk[2 * dp], a, bq[0], bq[1]);
        mma_16816(dk[2 * dp + 1], a, bq[2], bq[3]);
      }
    }

    if constexpr (kAtomicDq) {
      // dSᵀ → shared memory (bf16, [key][query]), so that warps can split dQ by queries.
#pragma unroll
      for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<uint32_t*>(sdSt + swizzle<BM>(key_row0 + g + 8 * half, nt) + 2 * t) =
              pack_bf16(ds[nt][2 * half], ds[nt][2 * half + 1]);
      __syncthreads();
      // dQ[q0.., cols] += dS·K for this warp's 16 queries and kDqCols columns, in chunks
      // of kDqChunk columns so that the partial sums need few registers.
      const int row_tile = warp % Tile::kDqRowTiles;
      const int qry0 = q0 + row_tile * 16 + g;
#pragma unroll
      for (int chunk = 0; chunk < Tile::kDqCols / Tile::kDqChunk; ++chunk) {
        const int col0 = (warp / Tile::kDqRowTiles) * Tile::kDqCols + chunk * Tile::kDqChunk;
        float dq[Tile::kDqChunk / 8][4];
#pragma unroll
        for (int dt = 0; dt < Tile::kDqChunk / 8; ++dt)
#pragma unroll
          for (int i = 0; i < 4; ++i) dq[dt][i] = 0.f;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          uint32_t a[4];
          load_a_trans<BM>(a, sdSt, row_tile * 16, kk * 16, lane);
#pragma unroll
          for (int dp = 0; dp < Tile::kDqChunk / 16; ++dp) {
            uint32_t bk[4];
            load_b_pair_trans<D>(bk, sK, kk * 16, col0 + dp * 16, lane);
            mma_16816(dq[2 * dp], a, bk[0], bk[1]);
            mma_16816(dq[2 * dp + 1], a, bk[2], bk[3]);
          }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (qry0 + 8 * half >= p.T) continue;
          float* dst = p.dq_accum + (bh * p.T + qry0 + 8 * half) * D + col0 + 2 * t;
#pragma unroll
          for (int dt = 0; dt < Tile::kDqChunk / 8; ++dt)
            atomic_add_pair(dst + dt * 8, dq[dt][2 * half], dq[dt][2 * half + 1]);
        }
      }
    }
  }

  // Epilogue: dK·scale and dV → bf16 into the K and V slots of dqkv (B,T,3,H,D).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = n0 + key_row0 + g + 8 * half;
    if (key >= p.T) continue;
    bf16* dk_dst = p.dqkv + (int64_t(b) * p.T + key) * p.qkv_row_stride + int64_t(p.H) * D + h * D + 2 * t;
    bf16* dv_dst = dk_dst + int64_t(p.H) * D;
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt) {
      *reinterpret_cast<uint32_t*>(dk_dst + dt * 8) =
          pack_bf16(dk[dt][2 * half] * p.scale, dk[dt][2 * half + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_dst + dt * 8) = pack_bf16(dv[dt][2 * half], dv[dt][2 * half + 1]);
    }
  }
}

// ---- 3. postprocess (atomic mode): dQ accumulator · scale → bf16 ------------------------
template <int kHeadDim>
__global__ void flash_bwd_postprocess_kernel(const FlashParams p) {
  // One thread per 4 elements of the (B,H,T,D) accumulator.
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = int64_t(p.B) * p.H * p.T * kHeadDim / 4;
  if (i >= n) return;
  const float4 x = reinterpret_cast<const float4*>(p.dq_accum)[i];
  const int64_t e = i * 4;
  const int d = int(e % kHeadDim);
  const int64_t bht = e / kHeadDim;
  const int t = int(bht % p.T);
  const int64_t bh = bht / p.T;
  const int h = int(bh % p.H), b = int(bh / p.H);
  bf16* dst = p.dqkv + (int64_t(b) * p.T + t) * p.qkv_row_stride + h * kHeadDim + d;
  uint2 packed;
  packed.x = pack_bf16(x.x * p.scale, x.y * p.scale);
  packed.y = pack_bf16(x.z * p.scale, x.w * p.scale);
  *reinterpret_cast<uint2*>(dst) = packed;
}

// ---- 3'. deterministic dQ: one block per query tile, looping over key tiles ----------------
template <int kHeadDim_>
struct DqTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;  // queries: 16 per warp
  static constexpr int kBlockN = 64;           // keys per tile
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr size_t kSmemBytes = size_t(2 * kBlockM + 4 * kBlockN) * kHeadDim * sizeof(bf16);
};

template <class Tile, bool kCausal>
__global__ void __launch_bounds__(Tile::kThreads) flash_bwd_dq_sm80_kernel(const FlashParams p) {
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [BM][D]
  bf16* sdO = sQ + BM * D;                   // [BM][D]
  bf16* sK = sdO + BM * D;                   // [2][BN][D]
  bf16* sV = sK + 2 * BN * D;                // [2][BN][D]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * BM;
  const int64_t bh = int64_t(b) * p.H + h;
  const int row0 = m0 + warp * 16;

  const bf16* q = p.qkv + int64_t(b) * p.T * p.qkv_row_stride + h * D;
  const bf16* k = q + int64_t(p.H) * D;
  const bf16* v = k + int64_t(p.H) * D;
  const bf16* dout = p.dout + int64_t(b) * p.T * p.o_row_stride + h * D;

  const int n_end = kCausal ? min(p.T, m0 + BM) : p.T;
  const int n_blocks = (n_end + BN - 1) / BN;

  load_tile_async<BM, D, Tile::kThreads>(sQ, q, p.qkv_row_stride, m0, p.T, tid);
  load_tile_async<BM, D, Tile::kThreads>(sdO, dout, p.o_row_stride, m0, p.T, tid);
  load_tile_async<BN, D, Tile::kThreads>(sK, k, p.qkv_row_stride, 0, p.T, tid);
  load_tile_async<BN, D, Tile::kThreads>(sV, v, p.qkv_row_stride, 0, p.T, tid);
  cp_async_commit();

  float lse_log2[2], delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    lse_log2[half] = row < p.T ? p.lse[bh * p.T + row] * kLog2e : 0.f;
    delta[half] = row < p.T ? p.delta[bh * p.T + row] : 0.f;
  }

  float dq[Tile::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) dq[dt][i] = 0.f;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int buf = nb & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (nb + 1 < n_blocks) {
      load_tile_async<BN, D, Tile::kThreads>(sK + (buf ^ 1) * BN * D, k, p.qkv_row_stride, (nb + 1) * BN, p.T, tid);
      load_tile_async<BN, D, Tile::kThreads>(sV + (buf ^ 1) * BN * D, v, p.qkv_row_stride, (nb + 1) * BN, p.T, tid);
      cp_async_commit();
    }
    const bf16* cK = sK + buf * BN * D;
    const bf16* cV = sV + buf * BN * D;
    const int n0 = nb * BN;

    // S = Q·Kᵀ and dP = dO·Vᵀ (16 queries × BN keys per warp)
    float s[Tile::kNTiles][4], dp[Tile::kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < Tile::kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = dp[nt][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t aq[4], ao[4];
      load_a<D>(aq, sQ, warp * 16, kk, lane);
      load_a<D>(ao, sdO, warp * 16, kk, lane);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4], bv[4];
        load_b_pair<D>(bk, cK, np * 16, kk, lane);
        load_b_pair<D>(bv, cV, np * 16, kk, lane);
        mma_16816(s[2 * np], aq, bk[0], bk[1]);
        mma_16816(s[2 * np + 1], aq, bk[2], bk[3]);
        mma_16816(dp[2 * np], ao, bv[0], bv[1]);
        mma_16816(dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }
    const bool needs_mask = n0 + BN > p.T || (kCausal && n0 + BN - 1 > m0);
#pragma unroll
    for (int nt = 0; nt < Tile::kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int half = i >> 1;
        float x = s[nt][i];
        if (needs_mask) {
          const int row = row0 + g + 8 * half;
          const int col = n0 + nt * 8 + 2 * t + (i & 1);
          if (col >= p.T || (kCausal && col > row)) x = -INFINITY;
        }
        const float prob = fast_exp2(fmaf(x, p.scale_log2, -lse_log2[half]));
        s[nt][i] = prob * (dp[nt][i] - delta[half]);  // dS
      }
    // dQ += dS·K
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      c_pair_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dpi = 0; dpi < D / 16; ++dpi) {
        uint32_t bk[4];
        load_b_pair_trans<D>(bk, cK, kk * 16, dpi * 16, lane);
        mma_16816(dq[2 * dpi], a, bk[0], bk[1]);
        mma_16816(dq[2 * dpi + 1], a, bk[2], bk[3]);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= p.T) continue;
    bf16* dst = p.dqkv + (int64_t(b) * p.T + row) * p.qkv_row_stride + h * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt)
      *reinterpret_cast<uint32_t*>(dst + dt * 8) =
          pack_bf16(dq[dt][2 * half] * p.scale, dq[dt][2 * half + 1] * p.scale);
  }
}

template <class Tile, bool kCausal>
void launch_bwd_tile(const FlashParams& p, bool deterministic, cudaStream_t stream) {
  constexpr int kHeadDim = Tile::kHeadDim;
  using DTile = DqTile<kHeadDim>;
  auto main_atomic = flash_bwd_sm80_kernel<Tile, kCausal, /*kAtomicDq=*/true>;
  auto main_no_dq = flash_bwd_sm80_kernel<Tile, kCausal, /*kAtomicDq=*/false>;
  auto dq_kernel = flash_bwd_dq_sm80_kernel<DTile, kCausal>;
  static const bool opted_in = opt_in_dynamic_smem(main_atomic, Tile::kSmemBytes) &&  // once
                               opt_in_dynamic_smem(main_no_dq, Tile::kSmemBytes) &&
                               opt_in_dynamic_smem(dq_kernel, DTile::kSmemBytes);
  (void)opted_in;

  launch_bwd_preprocess<kHeadDim>(p, /*zero_floats=*/deterministic ? 0 : int64_t(p.B) * p.H * p.T * kHeadDim, stream);
  const dim3 grid((p.T + Tile::kBlockN - 1) / Tile::kBlockN, p.H, p.B);
  if (!deterministic) {
    main_atomic<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH();
    launch_bwd_postprocess<kHeadDim>(p, stream);
  } else {
    main_no_dq<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH();
    const dim3 dq_grid((p.T + DTile::kBlockM - 1) / DTile::kBlockM, p.H, p.B);
    dq_kernel<<<dq_grid, DTile::kThreads, DTile::kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

// The kernels around the main one, shared with the sm90 path (flash_params.h).
template <int kHeadDim>
void launch_bwd_preprocess(const FlashParams& p, int64_t zero_floats, cudaStream_t stream) {
  const int64_t threads = int64_t(p.B) * p.T * p.H * (kHeadDim / 8);
  constexpr int kPreThreads = 256;
  flash_bwd_preprocess_kernel<kHeadDim>
      <<<unsigned((threads + kPreThreads - 1) / kPreThreads), kPreThreads, 0, stream>>>(p, zero_floats / 4);
  CUDA_CHECK_LAUNCH();
}

template <int kHeadDim>
void launch_bwd_postprocess(const FlashParams& p, cudaStream_t stream) {
  const int64_t vec4 = int64_t(p.B) * p.T * p.H * kHeadDim / 4;
  constexpr int kPostThreads = 256;
  flash_bwd_postprocess_kernel<kHeadDim>
      <<<unsigned((vec4 + kPostThreads - 1) / kPostThreads), kPostThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template void launch_bwd_preprocess<64>(const FlashParams&, int64_t, cudaStream_t);
template void launch_bwd_preprocess<128>(const FlashParams&, int64_t, cudaStream_t);
template void launch_bwd_postprocess<64>(const FlashParams&, cudaStream_t);
template void launch_bwd_postprocess<128>(const FlashParams&, cudaStream_t);

template <int kHeadDim, bool kCausal>
void launch_bwd_sm80(const FlashParams& p, bool deterministic, int tile, cudaStream_t stream) {
  if (tile == 1)
    launch_bwd_tile<typename BwdConfig<kHeadDim>::Tile1, kCausal>(p, deterministic, stream);
  else
    launch_bwd_tile<typename BwdConfig<kHeadDim>::Tile0, kCausal>(p, deterministic, stream);
}

template void launch_bwd_sm80<64, /*kCausal=*/true>(const FlashParams&, bool, int, cudaStream_t);
template void launch_bwd_sm80<64, /*kCausal=*/false>(const FlashParams&, bool, int, cudaStream_t);
template void launch_bwd_sm80<128, /*kCausal=*/true>(const FlashParams&, bool, int, cudaStream_t);
template void launch_bwd_sm80<128, /*kCausal=*/false>(const FlashParams&, bool, int, cudaStream_t);

}  // namespace flashgpt::cuda::attn
