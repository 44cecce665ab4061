// FlashAttention forward, portable path (sm_80+: mma.sync, ldmatrix, cp.async).
//
// One thread block per (query tile of kBlockM rows, head, batch). Each warp owns
// 16·kMTiles query rows. For every K/V tile of kBlockN keys (double-buffered in shared
// memory, the next one in flight while this one is used):
//   S = Q·Kᵀ                       tensor cores, fp32 accumulators in registers
//   mask                            only tiles that cross the diagonal or the end T
//   m_new = max(m, rowmax S)        online softmax in the exp2 domain (scale·log2 e folded)
//   P = exp2(S·c − m_new·c), O ← O·exp2((m − m_new)·c), l ← l·α + rowsum P
//   O += P·V                        P goes from accumulators to A fragments in registers
// Epilogue: O / l → bf16 (B,T,H,D); LSE = m·scale + ln l → fp32 (B,H,T).
// No T×T buffer exists: S and P live only in the registers of one tile.
#include <cmath>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/flash_fwd_parts.cuh"
#include "kernels/cuda/attention/sm80_primitives.cuh"

namespace flashgpt::cuda::attn {
namespace {

template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_>
struct FwdTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kMTiles_;             // 16-row MMA tiles per warp
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;  // query rows per block
  static constexpr int kBlockN = kBlockN_;               // keys per K/V tile
  static constexpr int kNTiles = kBlockN / 8;            // 8-column score tiles per row
  static constexpr int kDTiles = kHeadDim / 8;           // 8-column output tiles per row
  // Q tile + two buffers each of K and V.
  static constexpr size_t kSmemBytes = size_t(kBlockM + 4 * kBlockN) * kHeadDim * sizeof(bf16);
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockN % 16 == 0, "K/V tile is a whole number of MMA k-steps");
};

// The tile shapes, two per head dim (FLASHGPT_ATTENTION_FWD_TILE=0|1 picks one; see
// flash_attention.cu). Limits: the O accumulator (16·kMTiles × D fp32 per warp) and S
// (16·kMTiles × kBlockN) must fit in 255 registers without spilling, which is why D=128
// with 32 rows per warp takes 32-key tiles. 32 rows per warp halve the shared-memory
// reads of K and V per MMA compared with 16.
template <int kHeadDim> struct FwdConfig;
template <> struct FwdConfig<64> {
  using Tile0 = FwdTile<64, /*kWarps=*/4, /*kMTiles=*/2, /*kBlockN=*/64>;
  using Tile1 = FwdTile<64, /*kWarps=*/8, /*kMTiles=*/1, /*kBlockN=*/128>;
};
template <> struct FwdConfig<128> {
  using Tile0 = FwdTile<128, /*kWarps=*/8, /*kMTiles=*/1, /*kBlockN=*/64>;
  using Tile1 = FwdTile<128, /*kWarps=*/4, /*kMTiles=*/2, /*kBlockN=*/32>;
};

// S (per warp: kMTiles·16 rows × kBlockN keys) = Q·Kᵀ.
template <class Tile>
__device__ __forceinline__ void compute_scores(float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                               const bf16* sQ, const bf16* sK, int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < Tile::kHeadDim / 16; ++kk) {
    uint32_t a[Tile::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt)
      load_a<Tile::kHeadDim>(a[mt], sQ, warp * Tile::kRowsPerWarp + mt * 16, kk, lane);
#pragma unroll
    for (int np = 0; np < Tile::kBlockN / 16; ++np) {
      uint32_t b[4];
      load_b_pair<Tile::kHeadDim>(b, sK, np * 16, kk, lane);
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt) {
        mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// O += P·V, P rounded to bf16 straight from the score accumulators.
template <class Tile>
__device__ __forceinline__ void accumulate_pv(float (&o)[Tile::kMTiles][Tile::kDTiles][4],
                                              const float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                              const bf16* sV, int lane) {
#pragma unroll
  for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
    uint32_t a[Tile::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt) c_pair_to_a(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
    for (int dp = 0; dp < Tile::kHeadDim / 16; ++dp) {
      uint32_t b[4];
      load_b_pair_trans<Tile::kHeadDim>(b, sV, kk * 16, dp * 16, lane);
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt) {
        mma_16816(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16816(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <class Tile, bool kCausal>
__global__ void __launch_bounds__(Tile::kThreads) flash_fwd_sm80_kernel(const FlashParams p) {
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [BM][D]
  bf16* sK = sQ + BM * D;                    // [2][BN][D]
  bf16* sV = sK + 2 * BN * D;                // [2][BN][D]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Causal: the last query tiles have the most keys; start them first so the grid's
  // tail is made of short blocks.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * BM;
  const int warp_row0 = m0 + warp * Tile::kRowsPerWarp;

  const bf16* q = p.qkv + int64_t(b) * p.T * p.qkv_row_stride + h * D;
  const bf16* k = q + int64_t(p.H) * D;
  const bf16* v = k + int64_t(p.H) * D;

  // Causal: keys after the tile's last query are never needed.
  const int n_end = kCausal ? min(p.T, m0 + BM) : p.T;
  const int n_blocks = (n_end + BN - 1) / BN;

  load_tile_async<BM, D, Tile::kThreads>(sQ, q, p.qkv_row_stride, m0, p.T, tid);
  load_tile_async<BN, D, Tile::kThreads>(sK, k, p.qkv_row_stride, 0, p.T, tid);
  load_tile_async<BN, D, Tile::kThreads>(sV, v, p.qkv_row_stride, 0, p.T, tid);
  cp_async_commit();

  float o[Tile::kMTiles][Tile::kDTiles][4];
  float row_max[Tile::kMTiles][2], row_sum[Tile::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][dt][i] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int buf = nb & 1;
    // Tile nb has landed, and every warp is done with the other buffer (tile nb-1).
    cp_async_wait<0>();
    __syncthreads();
    if (nb + 1 < n_blocks) {
      const int nxt = (nb + 1) * BN;
      load_tile_async<BN, D, Tile::kThreads>(sK + (buf ^ 1) * BN * D, k, p.qkv_row_stride, nxt, p.T, tid);
      load_tile_async<BN, D, Tile::kThreads>(sV + (buf ^ 1) * BN * D, v, p.qkv_row_stride, nxt, p.T, tid);
      cp_async_commit();
    }
    const bf16* cK = sK + buf * BN * D;
    const bf16* cV = sV + buf * BN * D;

    float s[Tile::kMTiles][Tile::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tile::kNTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.f;
    compute_scores<Tile>(s, sQ, cK, warp, lane);

    const int n0 = nb * BN;
    // Only tiles that reach past T, or (causal) whose last key is after the block's
    // first query, hold masked scores.
    const bool needs_mask = n0 + BN > p.T || (kCausal && n0 + BN - 1 > m0);
    if (needs_mask) apply_mask<Tile, kCausal>(s, warp_row0, n0, p.T, lane);

    online_softmax<Tile>(s, o, row_max, row_sum, p.scale_log2);
    accumulate_pv<Tile>(o, s, cV, lane);
  }
  store_output<Tile>(p, o, row_max, row_sum, b, h, warp_row0, lane);
}

template <class Tile, bool kCausal>
void launch_fwd_tile(const FlashParams& p, cudaStream_t stream) {
  auto kernel = flash_fwd_sm80_kernel<Tile, kCausal>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once per process.
  static const bool opted_in = opt_in_dynamic_smem(kernel, Tile::kSmemBytes);  // once
  (void)opted_in;
  const dim3 grid((p.T + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <int kHeadDim, bool kCausal>
void launch_fwd_sm80(const FlashParams& p, int tile, cudaStream_t stream) {
  if (tile == 1)
    launch_fwd_tile<typename FwdConfig<kHeadDim>::Tile1, kCausal>(p, stream);
  else
    launch_fwd_tile<typename FwdConfig<kHeadDim>::Tile0, kCausal>(p, stream);
}

template void launch_fwd_sm80<64, /*kCausal=*/true>(const FlashParams&, int, cudaStream_t);
template void launch_fwd_sm80<64, /*kCausal=*/false>(const FlashParams&, int, cudaStream_t);
template void launch_fwd_sm80<128, /*kCausal=*/true>(const FlashParams&, int, cudaStream_t);
template void launch_fwd_sm80<128, /*kCausal=*/false>(const FlashParams&, int, cudaStream_t);

}  // namespace flashgpt::cuda::attn
