// One warpgroup's share of the pipelined Hopper attention forward: 64 query rows against
// key tiles of kBlockN keys in shared memory (wgmma layout), with the online softmax of
// flash_fwd_parts.cuh. Used by the warp-specialised forward, flash_fwd_sm90_ws.cu (tiles
// by TMA from a producer warpgroup); flash_fwd_sm90.cu uses its P·V issue loop (sm90::issue_pv)
// only (QKᵀ: sm90::issue_abt, wgmma_sm90.cuh).
//   S = Q·Kᵀ   wgmma m64n{kBlockN}k16, A (Q) and B (K) from shared memory
//   O += P·V   wgmma m64n{D}k16, A (P, bf16) from registers, B (V) from shared memory
//              with the transpose flag (V is stored [key][d]: d-contiguous = N-major)
// The schedule (FlashAttention-3's intra-warpgroup overlap): step_overlapped issues S_j and
// P_{j−1}·V_{j−1} together, runs the softmax of tile j while the tensor cores finish
// P_{j−1}·V_{j−1}, then rescales O; finish_overlapped adds the last P·V. The arithmetic
// is that of flash_fwd_sm90.cu's plain loop (S_j, softmax, O rescaled, P_j·V_j), in the
// same order. S, O and the kept P fit the consumers' registers at every tile of the
// warp-specialised forward (240 a thread with two consumers, 160 with three; mbar_wait's
// comment in tma_sm90.cuh says why that needs the wait's loop inside its asm).
#pragma once
#include "kernels/cuda/attention/flash_fwd_parts.cuh"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/wgmma_sm90.cuh"

namespace flashgpt::cuda::attn {

template <int kHeadDim_, int kBlockN_, int kBlockM_ = 128>
struct Sm90FwdTileShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per block: 64 per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;
  // Rows of the block's Q tile in shared memory ([D/64][kQRows][64]): kBlockM rounded up to
  // whole kBlockN-row boxes (the TMA loads Q in the K/V tiles' boxes; rows past kBlockM
  // are loaded and unused).
  static constexpr int kQRows = (kBlockM + kBlockN - 1) / kBlockN * kBlockN;
  static constexpr int kMTiles = 1;  // per warp: 16 rows (the m64 accumulator split over 4 warps)
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockN == 64 || kBlockN == 128 || kBlockN == 176, "wgmma wrappers exist for N = 64, 128 and 176");
  static_assert(kBlockM % 64 == 0, "64 query rows per consumer warpgroup");
};

#if FLASHGPT_HAS_WGMMA
namespace sm90 {
// O += P·V for the V tile at v_base ([D/64][BN][64]), P as bf16 A fragments, issued and
// committed: k-step kk is keys 16kk.. = 16 rows of 128 bytes; the d dimension spans D/64
// column blocks, BN·128 bytes apart (the leading-dimension offset, N-major).
template <int D, int BN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 8][4], const uint32_t (&a)[BN / 16][4], uint32_t v_base) {
  const uint64_t desc_v = make_desc(v_base, BN * 128, kSwizzleAtom);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs_tb<D>(o, a[kk], desc_advance(desc_v, kk * 16 * 128));
  wgmma_commit();
}
}  // namespace sm90

// kSplitSoftmax: step_overlapped's softmax split around the wait for the previous P·V
// (there); the warp-specialised forward's tiles say where (Sm90WsTile::split_softmax).
template <class Tile, bool kCausal, bool kSplitSoftmax = false>
struct Sm90FwdConsumer {
  static constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  using Scores = float[1][Tile::kNTiles][4];
  // The lazy running max (softmax_row_max in flash_fwd_parts.cuh), with O's rescale
  // skipped while no row of the warp moved it (rescale): at D = 128 (hopper_lazy_max).
  static constexpr bool kLazyMax = hopper_lazy_max<Tile>();

  const FlashParams& p;
  const int lane, wg, warp;
  int m0, wg_row0, warp_row0;  // the query tile's first row; wg_row0: this warpgroup's first
  uint32_t q_base;  // this warpgroup's 64 query rows: 64 rows × 128 bytes into column block 0
  float o[1][Tile::kDTiles][4];
  float row_max[1][2], row_sum[1][2];  // set by begin_tile
  uint32_t a[BN / 16][4];  // P of the last tile, bf16 A fragments

  // wg: this warpgroup's index among the consumers (rows 64·wg..); warp: its warp index in
  // the warpgroup; sQ: the block's Q tile ([D/64][kQRows][64]).
  __device__ Sm90FwdConsumer(const FlashParams& params, int m0_, int wg_, int warp_, int lane_, const bf16* sQ)
      : p(params), lane(lane_), wg(wg_), warp(warp_) {
    begin_tile(m0_, sQ);
  }
  // This warpgroup's 64 rows of the Q tile in sQ.
  __device__ __forceinline__ uint32_t rows_of(const bf16* sQ) const { return smem_u32(sQ) + wg * 64 * 128; }
  // A fresh query tile: rows m0_.., Q in sQ; O and the row statistics zero.
  __device__ __forceinline__ void begin_tile(int m0_, const bf16* sQ) {
    m0 = m0_;
    wg_row0 = m0_ + wg * 64;
    warp_row0 = wg_row0 + warp * 16;
    q_base = rows_of(sQ);
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[0][dt][i] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[0][half] = -INFINITY;
      row_sum[0][half] = 0.f;
    }
  }

  __device__ __forceinline__ void issue_qk(Scores& s, uint32_t k_base) {
    sm90::issue_abt<D, Tile::kQRows, BN>(s[0], q_base, k_base);  // S = Q·Kᵀ
  }
  __device__ __forceinline__ void issue_pv(uint32_t v_base) { sm90::issue_pv<D, BN>(o[0], a, v_base); }
  // Masks tile nb's scores and runs its softmax step: P in s, O's factor in alpha.
  __device__ __forceinline__ void softmax(Scores& s, float (&alpha)[1][2], int nb) {
    mask(s, nb);
    softmax_step<Tile, kLazyMax>(s, alpha, row_max, row_sum, p.scale_log2);
  }
  // O rescaled by the softmax step's alpha (step_overlapped's, once the previous P·V is done).
  __device__ __forceinline__ void rescale(const float (&alpha)[1][2]) {
    if constexpr (kLazyMax) rescale_output_if_moved<Tile>(o, alpha);
    else rescale_output<Tile>(o, alpha);
  }
  // Tile nb's scores past T or (causal) after their row: -inf.
  __device__ __forceinline__ void mask(Scores& s, int nb) {
    const int n0 = nb * BN;
    const bool needs_mask = n0 + BN > p.T || (kCausal && n0 + BN - 1 > m0);
    if (needs_mask) apply_mask<Tile, kCausal>(s, warp_row0, n0, p.T, lane);
  }
  // P (bf16) into the A fragments of the P·V, one accumulator row at a time (half 0: row
  // g, a[kk][0] and [2]; half 1: row g + 8), as sm80's c_pair_to_a packs them.
  __device__ __forceinline__ void keep_p_row(const Scores& s, int half) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      a[kk][half] = pack_bf16(s[0][2 * kk][2 * half], s[0][2 * kk][2 * half + 1]);
      a[kk][2 + half] = pack_bf16(s[0][2 * kk + 1][2 * half], s[0][2 * kk + 1][2 * half + 1]);
    }
  }
  __device__ __forceinline__ void keep_p(const Scores& s) {
    keep_p_row(s, 0);
    keep_p_row(s, 1);
  }

  // Tile nb with the previous tile's P·V (V at v_prev_base) under its softmax. The hooks
  // run where the pipeline may move on: once S (hence this K tile) is done, and once the
  // previous P·V (hence that V tile) is. (Code between the issue and the first wait, even a
  // bar.arrive, makes ptxas serialise the wgmmas: C7514.) kFirst: tile 0 of the query
  // tile, with no previous P·V. It is a template argument, not a test of nb: with the
  // P·V under a run-time branch, ptxas serialised every wgmma of a persistent version of
  // the kernel (C7520, "compiler-inserted WG.AR in divergent path"; 0.54-0.93x of this
  // one), and the peeled first step made this one 1-7% faster (BENCHMARKS.md,
  // "Seventeenth session").
  template <bool kFirst, class AfterQk, class AfterPv>
  __device__ __forceinline__ void step_overlapped(int nb, uint32_t k_base, uint32_t v_prev_base,
                                                  AfterQk after_qk, AfterPv after_pv) {
    Scores s;
    float alpha[1][2];
    sm90::wgmma_fence();  // a and o were last written by ordinary instructions
    issue_qk(s, k_base);
    if constexpr (!kFirst) issue_pv(v_prev_base);
    if constexpr (!kFirst) sm90::wgmma_wait<1>();  // S_nb done; P_{nb−1}·V_{nb−1} may still run
    else sm90::wgmma_wait<0>();
    sm90::fence_accumulators(s[0]);
    after_qk();
    // kSplitSoftmax: the wait for P_{nb−1}·V_{nb−1} inside the softmax: both rows' maxima,
    // row g's exponentials, then the wait, and O's rescale and row g's P (into a) beside
    // row g + 8's exponentials, where they take issue slots the special-function unit
    // leaves free instead of following the last exponential. The same arithmetic as
    // softmax(), so the same bits either way.
    float m_scaled[2];
    if constexpr (kSplitSoftmax) {
      mask(s, nb);
#pragma unroll
      for (int half = 0; half < 2; ++half)
        m_scaled[half] = softmax_row_max<Tile, kLazyMax>(s, alpha, row_max, 0, half, p.scale_log2);
      softmax_row_exp<Tile>(s, alpha, row_sum, 0, 0, m_scaled[0], p.scale_log2);
    } else {
      softmax(s, alpha, nb);
    }
    sm90::wgmma_wait<0>();  // P_{nb−1}·V_{nb−1} done: O and a are free
    sm90::fence_accumulators(o[0]);
    if constexpr (!kFirst) after_pv();
    rescale(alpha);
    if constexpr (kSplitSoftmax) {
      keep_p_row(s, 0);
      softmax_row_exp<Tile>(s, alpha, row_sum, 0, 1, m_scaled[1], p.scale_log2);
      keep_p_row(s, 1);
    } else {
      keep_p(s);
    }
  }
  // From one query tile to the next in a persistent kernel: this tile's last P·V and the
  // next tile's first QKᵀ (its Q in sQ_next, K at k_base) issued together. Once the P·V is
  // done, `after_pv` (V released, the turn handed on) and `epilogue` (this tile's output,
  // from O and the row statistics) run while the tensor cores do the QKᵀ; then the consumer
  // moves to rows m0_next.. (begin_tile) and runs that QKᵀ's softmax as
  // step_overlapped<true> does (the same arithmetic), after `after_qk` (K released).
  template <class AfterPv, class Epilogue, class AfterQk>
  __device__ __forceinline__ void step_across(uint32_t v_last_base, int m0_next, const bf16* sQ_next,
                                              uint32_t k_base, AfterPv after_pv, Epilogue epilogue,
                                              AfterQk after_qk) {
    Scores s;
    float alpha[1][2];
    sm90::wgmma_fence();
    issue_pv(v_last_base);
    sm90::issue_abt<D, Tile::kQRows, BN>(s[0], rows_of(sQ_next), k_base);
    sm90::wgmma_wait<1>();  // the P·V done; the QKᵀ may still run
    sm90::fence_accumulators(o[0]);
    after_pv();
    epilogue();
    begin_tile(m0_next, sQ_next);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(s[0]);
    after_qk();
    softmax(s, alpha, 0);
    rescale(alpha);
    keep_p(s);
  }
  // The last tile's P·V after step_overlapped.
  __device__ __forceinline__ void finish_overlapped(uint32_t v_last_base) {
    sm90::wgmma_fence();
    issue_pv(v_last_base);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(o[0]);
  }

  // Partial outputs of the same rows over different key tiles (the three-consumer forward's
  // split short tile, sm90ws_splits_keys): save_partial leaves this thread's O in o_dst and
  // its row max and partial sums in stat_dst (float arrays, thread t of the warpgroup at
  // stride 128: no bank conflicts), and add_partial, run by the thread of the same index
  // in another warpgroup (the same fragment layout), folds them into its own with the
  // softmax's rescale: O and the sums scaled by exp2((m − max of both)·c).
  static constexpr int kPartialO = Tile::kDTiles * 4, kPartialStats = 4;
  __device__ __forceinline__ void save_partial(float* o_dst, float* stat_dst, int t) const {
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o_dst[(dt * 4 + i) * 128 + t] = o[0][dt][i];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      stat_dst[half * 128 + t] = row_max[0][half];
      stat_dst[(2 + half) * 128 + t] = row_sum[0][half];
    }
  }
  __device__ __forceinline__ void add_partial(const float* o_src, const float* stat_src, int t) {
    float mine[2], theirs[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_other = stat_src[half * 128 + t];
      const float mx = fmaxf(row_max[0][half], m_other);
      const float m_scaled = mx == -INFINITY ? 0.f : mx * p.scale_log2;  // as softmax_row_max
      mine[half] = fast_exp2(row_max[0][half] * p.scale_log2 - m_scaled);
      theirs[half] = fast_exp2(m_other * p.scale_log2 - m_scaled);
      row_max[0][half] = mx;
      row_sum[0][half] = row_sum[0][half] * mine[half] + stat_src[(2 + half) * 128 + t] * theirs[half];
    }
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        o[0][dt][i] = o[0][dt][i] * mine[i / 2] + o_src[(dt * 4 + i) * 128 + t] * theirs[i / 2];
  }

  // O / l → bf16 (B,T,H,D) and LSE → (B,H,T) by each thread's own global stores (the
  // D = 64 persistent kernels' epilogue; the others stage_output).
  __device__ __forceinline__ void store(int b, int h) {
    store_output<Tile>(p, o, row_max, row_sum, b, h, warp_row0, lane);
  }
  // The epilogue's first half: O / l → bf16 into this warpgroup's 64 rows of a staging
  // tile in shared memory (sm90::stage_accumulator_bf16: D/64 column blocks of 64 rows,
  // `block_stride` elements apart, as a TMA box), which a TMA store then writes to
  // (B,T,H,D) (the kernel's store_output_tma); LSE → (B,H,T), rows < T. Through shared
  // memory and one TMA store, where each thread's own 4-byte global stores (store) cost
  // the forward 6-20% at T = 1024-2048 (BENCHMARKS.md, "Thirty-fifth session", call 1).
  __device__ __forceinline__ void stage_output(uint32_t stage, int block_stride, int b, int h) {
    const int g = lane >> 2, t = lane & 3;
    float inv[2], sum[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      sum[half] = quad_sum(row_sum[0][half]);
      inv[half] = inverse_row_sum(sum[half]);
      const int row = warp_row0 + g + 8 * half;
      if (t == 0 && row < p.T) store_row_lse(p, b, h, row, row_max[0][half], sum[half]);
    }
    sm90::stage_accumulator_bf16(stage, block_stride * uint32_t(sizeof(bf16)), (warp_row0 - wg_row0) / 16, lane, o[0],
                                 inv[0], inv[1]);
  }
};
#endif

}  // namespace flashgpt::cuda::attn
