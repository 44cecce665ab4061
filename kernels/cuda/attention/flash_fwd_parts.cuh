// The parts of the attention forward shared by the sm80 and sm90 paths, all per warp
// on m16n8 accumulator fragments (16·kMTiles query rows × 8-column tiles):
// the causal/length mask, the online-softmax step and the epilogue (O / l, LSE).
// A Tile type provides kHeadDim, kMTiles, kNTiles (score tiles), kDTiles (output tiles).
#pragma once
#include <cmath>
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/sm80_primitives.cuh"

namespace flashgpt::cuda::attn {

// Scores of keys >= T, and (causal) of keys after the query, become -inf. A key is
// masked when it comes after the last key its row sees (T − 1, or under a causal mask the
// row itself if that comes first), so each row takes one bound, as an offset from this
// thread's first column, and each score one compare against its column's offset, a
// constant of the unrolled loop.
template <class Tile, bool kCausal>
__device__ __forceinline__ void apply_mask(float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                           int warp_row0, int n0, int T, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + mt * 16 + g + half * 8;
      const int last = (kCausal ? min(row, T - 1) : T - 1) - n0 - 2 * t;  // columns n0 + 2t + c, c > last: masked
#pragma unroll
      for (int nt = 0; nt < Tile::kNTiles; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          if (nt * 8 + j > last) s[mt][nt][2 * half + j] = -INFINITY;
    }
}

// The online-softmax step of one accumulator row (rows g and g+8 of m-tile mt: half 0
// and 1) in two parts, so that a caller can put work between them (the warp-specialised
// forward, flash_fwd_sm90_consumer.cuh). softmax_row_max: the row's new running max (its
// quad's), the factor alpha = exp2((m_old − m_new)·c) by which O must be rescaled
// (rescale_output) before this tile's P·V is added, and returns the max in the log2
// domain. softmax_row_exp: s → P (unnormalised) and the running sum.
//
// kLazy: the running max is lazy (FlashAttention-4's rule; where: hopper_lazy_max below):
// it moves only when the tile's max exceeds it by more than kLazyMaxLog2 in the log2
// domain. Until then P = exp2(s·c − m·c) is at most 2^kLazyMaxLog2 (bf16 and the fp32 sums
// hold that with room to spare), alpha is exactly 1, and O keeps its scale, so the caller
// may skip its rescale (rescale_output_if_moved). The kept max is the one the exponentials
// used, so the LSE (max·scale + ln sum) is the same number in exact arithmetic. The forward ran
// 2.5-4.1% faster with it at D = 128 on an H200 and 1.9-5.3% on an H100, and 3.1-5.6%
// slower at D = 64, where the rescale it skips is half as long (BENCHMARKS.md, fifty-fourth
// and fifty-fifth sessions). Its cost in accuracy: a row's largest P is no longer exactly
// 1, so its bf16 rounding reaches O. With keys ramped up to 11 times N(0, 1), the part of
// dQ's error that comes from O's rounding grew by 10% rms, with keys up to 4 times not at
// all (scripts/o_rounding_sensitivity.cpp, D = 128).
constexpr float kLazyMaxLog2 = 8.f;
// The two Hopper forwards (sm90 and sm90ws) take the lazy max at D = 128, both, since they
// must give the same bits (CudaFlashAttention.Sm90WsForwardIsBitwiseEqualToSm90); only the
// warp-specialised one skips O's rescale with it (Sm90FwdConsumer::rescale). The sm80
// forward keeps the eager max: it rescales every tile, so the lazy max would buy it nothing.
template <class Tile>
constexpr bool hopper_lazy_max() { return Tile::kHeadDim == 128; }
template <class Tile, bool kLazy = false>
__device__ __forceinline__ float softmax_row_max(const float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                                 float (&alpha)[Tile::kMTiles][2],
                                                 float (&row_max)[Tile::kMTiles][2], int mt, int half,
                                                 float scale_log2) {
  float mx = row_max[mt][half];
#pragma unroll
  for (int nt = 0; nt < Tile::kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
  mx = quad_max(mx);
  // Not past the threshold: keep the old max. (A row with no unmasked key yet has old max
  // -inf: any finite mx moves it; an mx of -inf gives NaN here, so it stays -inf.)
  if constexpr (kLazy)
    if (!(mx * scale_log2 - row_max[mt][half] * scale_log2 > kLazyMaxLog2)) mx = row_max[mt][half];
  // A row that has seen only masked keys keeps max -inf: subtract 0 instead, which
  // avoids (-inf) − (-inf) = NaN; its P is then exp2(-inf) = 0.
  const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
  // Exactly 1 when the max did not change (computed, old·c − new·c contracts to an
  // fma that leaves the product's rounding error, and exp2 of that is not always 1),
  // so that a key tile wholly masked for a row leaves its O, sum and LSE bit for bit
  // as they were. (The three-consumer forward's rows met such tiles that sm90's do not
  // until its consumers skipped the key tiles they see none of, thirty-eighth session;
  // since, no row of the forwards compared bit for bit meets one, and the mutant
  // without this test survives. Kept: removing it changes every compiled forward, and
  // that was not measured.)
  alpha[mt][half] = mx == row_max[mt][half] ? 1.f : fast_exp2(row_max[mt][half] * scale_log2 - m_scaled);
  row_max[mt][half] = mx;
  return m_scaled;
}
template <class Tile>
__device__ __forceinline__ void softmax_row_exp(float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                                const float (&alpha)[Tile::kMTiles][2],
                                                float (&row_sum)[Tile::kMTiles][2], int mt, int half, float m_scaled,
                                                float scale_log2) {
  // Per-thread partial row sum: alpha is the same for the 4 threads of a row, so the
  // quad reduction can wait until the epilogue.
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < Tile::kNTiles; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float& x = s[mt][nt][2 * half + j];
      x = fast_exp2(fmaf(x, scale_log2, -m_scaled));
      sum += x;
    }
  row_sum[mt][half] = row_sum[mt][half] * alpha[mt][half] + sum;
}

// Online softmax step without touching O: updates the running max/sum, turns s into P
// (unnormalised), and returns in alpha the factor by which O must be rescaled
// (rescale_output) before this tile's P·V is added. The warp-specialised forward
// (flash_fwd_sm90_consumer.cuh) rescales later, once the previous tile's P·V has left the
// accumulators.
template <class Tile, bool kLazy = false>
__device__ __forceinline__ void softmax_step(float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                             float (&alpha)[Tile::kMTiles][2],
                                             float (&row_max)[Tile::kMTiles][2],
                                             float (&row_sum)[Tile::kMTiles][2], float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows g and g+8 of the 16-row tile
      const float m_scaled = softmax_row_max<Tile, kLazy>(s, alpha, row_max, mt, half, scale_log2);
      softmax_row_exp<Tile>(s, alpha, row_sum, mt, half, m_scaled, scale_log2);
    }
}

template <class Tile>
__device__ __forceinline__ void rescale_output(float (&o)[Tile::kMTiles][Tile::kDTiles][4],
                                               const float (&alpha)[Tile::kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int dt = 0; dt < Tile::kDTiles; ++dt) {
        o[mt][dt][2 * half] *= alpha[mt][half];
        o[mt][dt][2 * half + 1] *= alpha[mt][half];
      }
}

// rescale_output after a lazy max's step, skipped when no row of the warp moved its max
// (alpha 1 on every row: the rescale would multiply by 1). The vote keeps the branch
// warp-uniform.
template <class Tile>
__device__ __forceinline__ void rescale_output_if_moved(float (&o)[Tile::kMTiles][Tile::kDTiles][4],
                                                        const float (&alpha)[Tile::kMTiles][2]) {
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt) moved |= alpha[mt][0] != 1.f || alpha[mt][1] != 1.f;
  if (__any_sync(0xffffffffu, moved)) rescale_output<Tile>(o, alpha);
}

// Online softmax step: softmax_step, then O rescaled at once.
template <class Tile, bool kLazy = false>
__device__ __forceinline__ void online_softmax(float (&s)[Tile::kMTiles][Tile::kNTiles][4],
                                               float (&o)[Tile::kMTiles][Tile::kDTiles][4],
                                               float (&row_max)[Tile::kMTiles][2],
                                               float (&row_sum)[Tile::kMTiles][2], float scale_log2) {
  float alpha[Tile::kMTiles][2];
  softmax_step<Tile, kLazy>(s, alpha, row_max, row_sum, scale_log2);
  rescale_output<Tile>(o, alpha);
}

// A finished row's epilogue terms, shared by every forward's epilogue (store_output below,
// Sm90FwdConsumer::stage_output): O's scale, 1 / the row's softmax sum (0 for a row that
// saw no key), and its natural-log LSE into (B,H,T), the convention the backward reads.
__device__ __forceinline__ float inverse_row_sum(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }
__device__ __forceinline__ void store_row_lse(const FlashParams& p, int b, int h, int row, float row_max, float sum) {
  p.lse[(int64_t(b) * p.H + h) * p.T + row] = row_max * p.scale + logf(sum);
}

// O / l → bf16 (B,T,H,D) and LSE → (B,H,T), rows < T only.
template <class Tile>
__device__ __forceinline__ void store_output(const FlashParams& p,
                                             float (&o)[Tile::kMTiles][Tile::kDTiles][4],
                                             const float (&row_max)[Tile::kMTiles][2],
                                             const float (&row_sum)[Tile::kMTiles][2], int b, int h,
                                             int warp_row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + mt * 16 + g + 8 * half;
      const float sum = quad_sum(row_sum[mt][half]);
      if (row >= p.T) continue;
      const float inv = inverse_row_sum(sum);
      bf16* dst = p.out + (int64_t(b) * p.T + row) * p.o_row_stride + h * Tile::kHeadDim + 2 * t;
#pragma unroll
      for (int dt = 0; dt < Tile::kDTiles; ++dt)
        *reinterpret_cast<uint32_t*>(dst + dt * 8) =
            pack_bf16(o[mt][dt][2 * half] * inv, o[mt][dt][2 * half + 1] * inv);
      if (t == 0) store_row_lse(p, b, h, row, row_max[mt][half], sum);
    }
}

}  // namespace flashgpt::cuda::attn
