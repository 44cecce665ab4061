// FlashAttention backward, Hopper path (sm_90a): the algorithm of flash_bwd_sm80.cu
// (recompute P from the LSE, a K/V tile at a time looping over the query tiles that see
// it, dK and dV in registers, dQ added up across key tiles) with all five matmuls on
// warpgroup MMA (wgmma). Preprocess (D = rowsum(dO∘O), zeroing of the dQ accumulator)
// and postprocess (dQ → bf16) are the sm80 kernels.
//
// Work items are (K/V tile, batch·head) pairs; an item walks the query tiles that see its
// keys upwards, or (D = 128, causal, every mode but owner) downwards. A block loops over
// items that it claims from a counter (persistent: one block per SM; or a block per item),
// with K and V double-buffered so that the next item's tiles load during this one (kernel
// comment).
//
// One block = 2 warpgroups = kBlockN = 128 keys (64 per warpgroup); query tiles of
// kBlockM rows: 128 at D = 64; 64 at D = 128, and 80 without a mask in flat mode
// (FlashAttention-3's tile there; Sm90BwdConfig). Thread 0 loads each query tile's Q,
// dO, LSE and D by TMA, one step ahead, into two buffers that complete on mbarriers (and
// the first thread of warpgroup 1 issues the TMA dQ below); both issue just after their
// warpgroup's Sᵀ and dPᵀ wgmmas, not before: wgmma waits for all four warps of a
// warpgroup, so TMA work in front of it held the tensor cores back (2-4% of the
// backward's time on an H200). Per query tile (a step), each warpgroup:
//   Sᵀ  = K·Qᵀ      wgmma m64n{BM}k16, A (its 64 keys of K) and B (Q) K-major in smem
//                   (kPreissueS: issued by the step before, behind its dQ)
//   dPᵀ = V·dOᵀ     the same with V and dO (issued right behind Sᵀ)
//   Pᵀ = exp2(Sᵀ·c − LSE·log2 e), dSᵀ = Pᵀ ∘ (dPᵀ − D)    on the accumulators
//   dV += Pᵀ·dO     wgmma m64n{D}k16, A (Pᵀ, bf16) from registers, B (dO) MN-major
//   dK += dSᵀ·Q     the same with dSᵀ and Q
//   dSᵀ → shared memory (bf16, [key][query]); barrier over both warpgroups
//   dQ = dS·K       wgmma m64n64k16, A (dS) and B (K) MN-major in smem, all 128 keys;
//                   each warpgroup takes one 64×64 block of the BM×D tile of dQ (80
//                   queries: dQᵀ's m64n80k16, an 80×64 block; tma
//                   and owner modes: dQᵀ = Kᵀ·dSᵀ, A and B swapped, for bank-conflict-
//                   free stores to the tile)
//   dQ → the (B·H, T, D) fp32 accumulator, in one of four modes (DqMode):
//     tma:    into a shared-memory tile (swizzled 64×32 boxes); at the next step, behind
//             the first matmuls, warpgroup 1's first thread adds it with
//             cp.reduce.async.bulk.tensor (thread 0 has the loads), which
//             runs while the block computes (at D = 128 the two dQ tiles take the room of
//             the second K/V buffer: the next item's K and V load by TMA during the
//             item's last step, V once this warpgroup's dPᵀ has read it and K once both
//             warpgroups' dQ has: kEarlyKv; against every thread's cp.async, early
//             only under a causal mask, this kernel took 5% less time at 16 x 16 x 1K
//             causal, and the early loads without a mask 2-4% less at 1K)
//     flat:   as tma, the tile in register order (dq_tile.h's flat tile: 8 st.shared.v4
//             a thread, not 32 scalar stores) and added by one bulk reduce-add (L2
//             evict_last) to an accumulator in the same order, B·H·m_blocks tiles of
//             BM·D floats; its postprocess (below) puts the rows in place. auto's choice.
//             With 80-query tiles (one slot: two would not fit) each warpgroup's first
//             thread adds its own block at the step's end (Sm90BwdTile::kEagerDq), and
//             warpgroup 1 stages dK and dV in dSᵀ's room.
//     atomic: per-thread 8-byte red.global.add.v2.f32 (every warp's registers stay held
//             until the atomics drain: ~20% of the stall samples in ncu; 3-22% slower
//             than tma on an H200)
//     owner:  a block claims all K/V tiles of one (batch, head) and walks them in
//             order, so it is the only writer of that head's dQ: the first contribution
//             of each query tile is a TMA store, the middle ones TMA adds (both through
//             the shared-memory tile, as tma), the last one adds the partial (read back
//             once the TMA is done) and writes bf16, with no zeroed accumulator and no
//             postprocess (that thread hands a tile to the TMA at the next step's start, so
//             that the waits for the TMA there cover it). A query tile's last contribution
//             is its key tile on the diagonal (causal) or the last key tile. At D = 128
//             (64-query tiles, two dQ slots) the TMA-reading-a-slot wait before the
//             barrier lets one bulk group stay in flight: the steps that write no tile (a
//             last contribution) must not sit between two that do unless they drain the
//             TMA, and they do: those with an earlier contribution wait for all of it,
//             and those without one (causal query tiles 0 and 1, or one key tile) come
//             first in a unit, after the last item of the previous unit, whose steps
//             write no tile either.
// At an item's end dK·scale and dV → bf16 into dqkv: each thread's own 4-byte stores, or
// (kStageDkDv, dq_mode.h's stages_dk_dv: at D = 64 flat mode up to T = 2048, 4096 causal;
// at D = 128 tma and flat modes, causal up to T = 4096) through shared memory (D = 64:
// dSᵀ's room; D = 128: the step's Q and dO buffers and a dQ slot) and one TMA store a
// tensor from each warpgroup's first thread.
// At D = 64 dV and dK are issued together once dSᵀ is ready; at D = 128 (TMA dQ) dV goes
// before dPᵀ is waited for and dK behind dQ, so that they run under the dSᵀ arithmetic and
// under dQ's trip to shared memory (kSpreadDkDv; +2-4% at T >= 4K).
// Because Sᵀ is computed with keys as M, Pᵀ and dSᵀ come out of the accumulators in the
// A-fragment layout of the register operand: neither goes through shared memory for
// dV and dK. Not (yet) here: warp specialisation (the two warpgroups step in lockstep,
// two barriers a step), overlap of one tile's softmax with the next tile's matmuls
// (FlashAttention-3), a deterministic dQ (that mode runs the sm80 kernels). Issuing the
// next step's Sᵀ at the end of each step: an early version was 12% slower at GPT-2's
// shape (it waits for the next query tile half a step sooner) and was dropped; the
// nineteenth session's (kPreissueS: behind the step's dQ, at D = 64 in tma and atomic
// modes) took the T = 65,536 backward 0.6-1.7% faster and moved the sweep's tma-mode
// D = 64 shapes by -0.5% to +6%; owner mode and D = 128 keep Sᵀ at the step's start.
// (Owner mode was auto's choice at GPT-2's shape until the twenty-eighth session; tma
// mode's items in head groups now run there, with the early Sᵀ.) A
// warp-specialised version of this loop (a TMA producer warpgroup at 24 registers, these
// two warpgroups as consumers at 240 via setmaxnreg) was written and dropped before it
// ran: ptxas spilled 600-970 bytes in its consumers, while this kernel compiles within
// 255 registers without spills (ptxas_report.sh --strict checks). The likely cause, found
// in the forward since: mbar_wait's C++ spin loop (now mbar_wait_spin, which this kernel
// still uses) made ptxas ignore setmaxnreg and hold the consumers to the launch's even
// share, 168 registers at 384 threads; with mbar_wait's asm loop they get their 240.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/dq_tile.h"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/tma_sm90.cuh"
#include "kernels/cuda/attention/wgmma_sm90.cuh"

namespace flashgpt::cuda::attn {
namespace {

template <int kHeadDim_, int kBlockM_>
struct Sm90BwdTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = 2;
  static constexpr int kThreads = kWarpGroups * 128;
  static constexpr int kBlockN = kWarpGroups * 64;  // keys per block: 64 per warpgroup
  static_assert(kBlockN == kBwdKeyTile, "dq_mode.h's head groups count key tiles of kBwdKeyTile keys");
  static constexpr int kBlockM = kBlockM_;          // queries per inner step
  static constexpr int kMTiles = kBlockM / 8;       // 8-column accumulator tiles of Sᵀ
  static constexpr int kDTiles = kHeadDim / 8;
  // dQ (kBlockM × kHeadDim) in two blocks, one per warpgroup: split along the queries
  // when kBlockM = 128 (D = 64: 64×64 blocks), along the head dim when kHeadDim = 128
  // (kBlockM × 64 blocks). kDqTiles: the 8-column accumulator tiles of a warpgroup's
  // block of dQᵀ (its columns are queries).
  static constexpr bool kDqSplitsD = kHeadDim == 128;
  static constexpr int kDqTiles = kDqSplitsD ? kBlockM / 8 : 8;
  // A row (key) of dSᵀ: whole 64-query swizzle atoms (80 queries: the second atom holds 16).
  static constexpr int kDsCols = (kBlockM + 63) / 64 * 64;
  // Owner mode (below): the dQ partial of one query tile, fp32, rows padded by 4 floats
  // (16 bytes, so rows stay cp.async-aligned and the fragment reads spread over banks).
  static constexpr int kAccStride = kHeadDim + 4;
  // TMA dQ: the query tile's dQ partial (fp32) in boxes of 64 rows × 32 columns (128-byte
  // rows, the TMA's 128-byte swizzle), kDqBufs of them; with them the K/V pair is not
  // double-buffered at D = 128 (kKvBufs), or shared memory would not hold it all. (Two
  // slots at D = 128 with 64-query tiles; with 80, two would not fit.)
  static constexpr int kv_bufs(bool tma) { return tma && kHeadDim == 128 ? 1 : 2; }
  static constexpr int dq_bufs(bool tma) { return !tma ? 0 : kHeadDim == 128 && kBlockM == 64 ? 2 : 1; }
  // With 80-query tiles (flat mode only) each warpgroup hands its own block of the tile
  // to the TMA as soon as it has written it, at the end of the step (kernel: the flat
  // tile), not the whole tile at the next step's start: with one slot the reduce-add then
  // has most of a step to read it before the next step's dQ overwrites it. On an H200,
  // against the 64-query tiles of two slots (BENCHMARKS.md, "Forty-fourth session", calls
  // 2 and 3, two rounds each, 1K and 16K): the whole tile at the next step's start ran
  // 4-7% slower, each warpgroup's block at the step's end 0.4-3.3% faster; each warp's own
  // part (a warp-major tile, 5 KB a reduce) was slower than that, and the same eager
  // warpgroup reduce at D = 64 (128-query tiles, one slot) 5% slower at 16 x 32 x 1K.
  static constexpr bool kEagerDq = kHeadDim == 128 && kBlockM == 80;
  static_assert(kDqTiles * 8 * 64 == kBlockM * kHeadDim / 2 && (!kEagerDq || kDqSplitsD),
                "a warpgroup's block of dQ (64 rows of dQᵀ) is half the tile's");
  // K and V load by TMA only at D = 128 (one K/V buffer, kv_bufs), through the Q map
  // (boxes of kBlockM rows) when its boxes are 64 rows; 80-query tiles give them a map of
  // their own (Sm90BwdMaps::kv). D = 64 loads them by cp.async and needs none.
  static constexpr bool kKvMap = kHeadDim == 128 && kBlockM != 64;
  static constexpr size_t kDqTileBytes = size_t(kBlockM) * kHeadDim * sizeof(float);
  // LSE and D of a query tile: the TMA reads kBlockM + 4 floats from the 16-byte boundary
  // at or before the tile's first row (a box must start 16-byte aligned in global
  // memory), into buffers of kLseStride floats (128-byte aligned).
  static constexpr int kLseBox = kBlockM + 4, kLseStride = (kLseBox + 31) / 32 * 32;
  static constexpr size_t kAccBytes = size_t(kBlockM) * kAccStride * sizeof(float);
  // The dQ tiles (tma); with owner mode the partial of a tile's last contribution shares
  // their room (it is read only at steps that write no tile, after the TMA is done).
  static constexpr size_t dq_region(bool owner, bool tma) {
    return owner ? std::max(dq_bufs(tma) * kDqTileBytes, kAccBytes) : dq_bufs(tma) * kDqTileBytes;
  }
  // kv_bufs × (K, V); 2 × (Q, dO); dSᵀ; [tma: the dQ tiles, owner: or the dQ partial];
  // 2 × (LSE, D); slack to align the base to 1024 bytes.
  static constexpr size_t smem_bytes(bool owner, bool tma) {
    return size_t(2 * kv_bufs(tma) * kBlockN + 4 * kBlockM) * kHeadDim * sizeof(bf16) +
           size_t(kBlockN) * kDsCols * sizeof(bf16) + dq_region(owner, tma) + 4 * kLseStride * sizeof(float) + 1024;
  }
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kHeadDim == 64 ? kBlockM == 128 : kBlockM == 64 || kBlockM == 80,
                "D = 64: 128-query tiles (two 64x64 dQ blocks); D = 128: 64 or 80 (wgmma wrappers for N = 64, 80)");
};
// Registers per thread decide the shapes: dK + dV hold 2·64·D/128 fp32 (128 at D = 128),
// Sᵀ and dPᵀ 2·64·BM/128 (64 at BM = 64, 80 at BM = 80), which leaves no room for BM = 128
// at D = 128. FullFlatTile: the full-mask tile of flat mode (D = 128: 80 queries, as
// FlashAttention-3: Sᵀ, dPᵀ and dQᵀ are m64n80 wgmmas, whose operands take less shared-
// memory bandwidth per flop than m64n64's, and a step's fixed costs cover 25% more work;
// a sequence's last tile may hold up to 79 masked rows). Measured against the 64-query
// tiles on an H200: kEagerDq's comment (the masked rows of T = 1024's last tile, 1.5% of
// its work, included). Under a causal mask key tiles must span whole query tiles.
template <int kHeadDim> struct Sm90BwdConfig;
template <> struct Sm90BwdConfig<64> {
  using Tile = Sm90BwdTile<64, /*kBlockM=*/128>;
  using FullFlatTile = Tile;
};
template <> struct Sm90BwdConfig<128> {
  using Tile = Sm90BwdTile<128, /*kBlockM=*/64>;
  using FullFlatTile = Sm90BwdTile<128, kFullFlatRows128>;  // (80: dq_mode.h sizes the accumulator by it)
};

// The TMA descriptors of one launch (kernel parameters, __grid_constant__): the loads of
// each query tile (Q from qkv, dO: boxes of 64 columns × kBlockM rows, 128-byte swizzle;
// LSE and D as flat (B·H·T) fp32 arrays, boxes of kLseBox), the TMA dQ's fp32
// accumulator (else unused), and the staged stores of dK and dV (dqkv, boxes of 64
// columns × 64 rows; else unused).
struct Sm90BwdMaps {
  CUtensorMap q, dout, lse, delta;
  union {
    CUtensorMap dq;  // tma and owner modes
    CUtensorMap kv;  // flat mode with 80-query tiles: K and V from qkv, boxes of 64 rows
  };
  CUtensorMap dqkv;
};

#if FLASHGPT_HAS_WGMMA
// dst[0] += x, dst[1] += y in one 8-byte vector atomic (sm_90 only).
__device__ __forceinline__ void atomic_add_pair(float* dst, float x, float y) {
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ void st_shared_v4_f32(uint32_t addr, const float (&x)[4]) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3])
               : "memory");
}
#endif

// kTmaDq: dQ by TMA reduce-adds through maps.dq, the (B·H, T, D) fp32 accumulator as a
// tensor of boxes of 64 rows × 32 columns. kOwner (with kTmaDq): one block owns all the
// key tiles of a (batch, head) and so is the only writer of its dQ: TMA stores, then
// adds, then the partial read back. kFlatDq (with kTmaDq, not kOwner): the tile and the
// accumulator in register order (dq_tile.h's flat tile), one bulk reduce-add a tile.
// kStageDkDv (D = 64 flat mode; D = 128 tma and flat): each item's dK and dV leave through
// shared memory and a TMA store (below; dq_mode.h's stages_dk_dv says where).
template <class Tile, bool kCausal, bool kOwner, bool kTmaDq, bool kFlatDq, bool kStageDkDv>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ Sm90BwdMaps maps, const FlashParams p) {
#if FLASHGPT_HAS_WGMMA
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  constexpr int kKvBufs = Tile::kv_bufs(kTmaDq), kDqBufs = Tile::dq_bufs(kTmaDq);
  static_assert(BN % BM == 0 || (!kCausal && !kOwner),
                "a key tile spans whole query tiles (the causal diagonal, owner mode's last contribution)");
  static_assert(kFlatDq || Tile::kDqTiles == 8, "80-query tiles: flat mode only");
  static_assert(!kOwner || kTmaDq, "owner mode writes dQ through the TMA tile");
  static_assert(!kFlatDq || (kTmaDq && !kOwner), "the flat tile is tma mode's");
  extern __shared__ unsigned char smem_raw[];
  // The hardware applies the 128B swizzle from address bits: tiles start 1024-aligned.
  // (Offsetting smem_raw keeps the pointers in the shared state space: plain loads and
  // stores through them compile to LDS/STS, not generic LD/ST.)
  unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  bf16* sK = reinterpret_cast<bf16*>(smem);  // [kv_bufs][BN][D]   wgmma layout, by item parity
  bf16* sV = sK + kKvBufs * BN * D;          // [kv_bufs][BN][D]
  bf16* sQ = sV + kKvBufs * BN * D;          // [2][BM][D]   by step parity
  bf16* sdO = sQ + 2 * BM * D;               // [2][BM][D]
  bf16* sdSt = sdO + 2 * BM * D;             // [kDsCols/64][BN][64]  dSᵀ, keys × queries
  float* sDq = reinterpret_cast<float*>(sdSt + BN * Tile::kDsCols);  // tma: [dq_bufs][BM·D] boxes
  float* sLse = sDq + Tile::dq_region(kOwner, kTmaDq) / sizeof(float);  // [2][kLseStride]  natural-log LSE
  float* sDelta = sLse + 2 * Tile::kLseStride;                            // [2][kLseStride]
  float* sAcc = sDq;  // owner: [BM][kAccStride], in the dQ tiles' room
  __shared__ int sItem[2];  // items ahead, by ordinal parity (static: no base register)

  // The warp index, at D = 128 through sm90::warp_uniform, so that the compiler knows it
  // (and so wg, the warpgroup) is the same in every lane of the warp; on an
  // H200 that ran the D = 128 backward 0.9% faster at 4 x 16 x 4K full and 0.5-1.1% at
  // 8 x 16 x 2K causal (two rounds) and level within noise at 1K and 16K, and the D = 64 one
  // 0.4-0.5% slower at 16K (BENCHMARKS.md, "Thirty-eighth session", call 3).
  const int tid = threadIdx.x, lane = tid & 31, warp = D == 128 ? sm90::warp_uniform(tid >> 5) : tid >> 5;
  const int wg = warp / 4, g = lane >> 2, t = lane & 3;
  const int warp_key0 = wg * 64 + (warp % 4) * 16;  // this warp's first key within the tile

  // Work items: one per (key tile, batch·head). The tma, flat and atomic modes number them in
  // groups of p.bwd_head_group (batch·head)s (dq_mode.h's choose_head_group: the pairs
  // whose key tiles fill one wave of blocks), key tile major within a group, so that under
  // a causal mask the items with the most query tiles come first. Block x
  // starts with item x; every further item comes from the counter p.item_counter (zeroed
  // by the preprocess), in order, to whichever block asks first: the longest items
  // first, and no block left with more than its share. With a block per item, each
  // block's one claim comes back past the end. A block claims its next item just in time
  // (thread 0, kLateClaim below; the answer lands in sItem a step later), a few steps
  // before that item starts, in time to load its K and V.
  // Owner mode numbers them (batch·head) major and hands out whole (batch, head) units
  // the same way, but claims the unit after next at each unit's first step, so that a
  // block knows its next unit one unit ahead; a block walks a unit's key tiles in
  // order, so every query tile's first dQ contribution (key tile 0) comes before the
  // others, and its last (causal: the diagonal; else the last key tile) after them.
  const int heads = p.B * p.H;
  const int n_blocks = (p.T + BN - 1) / BN, m_blocks = (p.T + BM - 1) / BM;
  const int items = n_blocks * heads;
  // The groups one after the other (1: (batch·head) major; all of them: key tile major);
  // the last one may be smaller.
  const int group = std::min(std::max(p.bwd_head_group, 1), heads);
  auto group_first = [&](int it) { return it / (group * n_blocks) * group; };
  auto item_n = [&](int it) {  // key tile
    if (kOwner) return it % n_blocks;
    const int g0 = group_first(it);
    return (it - g0 * n_blocks) / min(group, heads - g0);
  };
  auto item_bh = [&](int it) {
    if (kOwner) return it / n_blocks;
    const int g0 = group_first(it);
    return g0 + (it - g0 * n_blocks) % min(group, heads - g0);
  };
  // Causal: queries before an item's first key see none of it.
  auto first_m_of = [&](int n_block) { return kCausal ? n_block * BN / BM : 0; };
  // The order of an item's query tiles: upwards from the first that sees the key tile,
  // or, kDescending, from the last down to it (its diagonal tiles last). Measured on an
  // H200 (BENCHMARKS.md, "Twenty-ninth session", call 2, backward TFLOP/s, two rounds):
  // at D = 128 under a causal mask descending ran 1 x 16 x 16K at 535 and 522 against
  // 516 and 506, and 8 x 16 x 2K at 384-386 against 378-381; at D = 64 it moved the
  // shapes measured by -0.7% (T = 65,536; the long step 641-642 ms against 640) to +1.5%
  // (16K), and without a mask (every item starts at query tile 0) it changes no
  // schedule. (The L2 hit rate at D = 128, 16K stayed 87-88%, ncu: not a locality gain.)
  // Owner mode keeps upwards: its dQ contributions are ordered by key tile.
  constexpr bool kDescending = kCausal && !kOwner && D == 128;
  auto start_m_of = [&](int n_block) { return kDescending ? m_blocks - 1 : first_m_of(n_block); };
  constexpr int kMStep = kDescending ? -1 : 1;
  auto start_m = [&](int it) { return start_m_of(item_n(it)); };
  // The first item of the unit claimed now (past the end: items).
  auto claim = [&]() {
    const int u = int(gridDim.x) + atomicAdd(p.item_counter, 1);
    return kOwner ? (u < heads ? u * n_blocks : items) : u;
  };
  // kLateClaim (every mode but owner): a block claims its next item kClaimLead + 1 steps
  // before that item starts, not an item ahead. Claimed an item ahead, an item began
  // as late as a whole item after its claim (items of 2 to T/64 steps), so the key tiles
  // of one (batch, head), claimed together, began up to an item apart and read its Q, dO
  // and dQ rows each on its own; claimed just in time they begin within a few steps of
  // each other and share those rows in the L2 (Nsight Compute, H100, 8 x 16 x 2K causal:
  // L2 read misses ~19.4 M sectors against cuDNN's 10.7 M at every head group before).
  // kClaimLead: the steps before an item starts at which its K and V load (one K/V
  // buffer, by TMA: 1, the last step of the item before; two, by cp.async: 2, so that the
  // load has a step to land before the pre-issued Sᵀ of the item's first step reads K).
  // The claim of the next item comes a step before that, at the step kClaimLead + 1 from
  // an item's end; an item of kClaimLead steps or fewer loads its successor's K and V at
  // its first step, and has that successor claimed at the last step of the item before.
  constexpr bool kLateClaim = !kOwner;
  constexpr int kClaimLead = kKvBufs == 1 ? 1 : 2;
  auto item_steps = [&](int it) { return m_blocks - first_m_of(item_n(it)); };

  auto k_src = [&](int it) {
    const int bh = item_bh(it);
    return p.qkv + int64_t(bh / p.H) * p.T * p.qkv_row_stride + int64_t(p.H + bh % p.H) * D;
  };
  // Two K/V buffers (D = 64): K and V of item it into buffer kv_buf by cp.async, all threads.
  auto load_kv = [&](int it, int kv_buf) {
    const bf16* k = k_src(it);
    const int n0 = item_n(it) * BN;
    sm90::load_tile_async<BN, D, Tile::kThreads>(sK + kv_buf * BN * D, k, p.qkv_row_stride, n0, p.T, tid);
    sm90::load_tile_async<BN, D, Tile::kThreads>(sV + kv_buf * BN * D, k + int64_t(p.H) * D, p.qkv_row_stride, n0,
                                                 p.T, tid);
  };
  // One K/V buffer (D = 128, TMA dQ): K and V by TMA through the Q map (the same boxes of
  // 64 rows × 64 columns, 128-byte swizzle, at K's and V's columns of qkv; rows >= T
  // arrive as zeros), completing on kv_full, whose phase takes three arrivals: each
  // warpgroup's first thread for the warpgroup's 64 rows of V (only its dPᵀ reads them),
  // thread 0 for K (both warpgroups' dQ reads all of it). One thread issues what took all
  // 256 threads' cp.async and a wait with a barrier. (80-query tiles: the Q map's boxes
  // are 80 rows; K and V have a map of their own.)
  __shared__ alignas(8) uint64_t kv_full;
  static_assert(!Tile::kKvMap || kKvBufs == 1, "a K/V map only where K and V load by TMA");
  const CUtensorMap* kv_map = Tile::kKvMap ? &maps.kv : &maps.q;
  auto issue_v_rows = [&](int it, int half) {
    const int bh = item_bh(it), n0 = item_n(it) * BN + half * 64;
    sm90::mbar_arrive_expect_tx(&kv_full, 64 * D * sizeof(bf16));
#pragma unroll
    for (int c = 0; c < D / 64; ++c)
      sm90::tma_load_3d(sV + c * BN * 64 + half * 64 * 64, kv_map, &kv_full, (2 * p.H + bh % p.H) * D + c * 64, n0,
                        bh / p.H);
  };
  auto issue_k = [&](int it) {
    const int bh = item_bh(it), n0 = item_n(it) * BN;
    sm90::mbar_arrive_expect_tx(&kv_full, BN * D * sizeof(bf16));
#pragma unroll
    for (int half = 0; half < BN / 64; ++half)
#pragma unroll
      for (int c = 0; c < D / 64; ++c)
        sm90::tma_load_3d(sK + c * BN * 64 + half * 64 * 64, kv_map, &kv_full, (p.H + bh % p.H) * D + c * 64,
                          n0 + half * 64, bh / p.H);
  };
  // Q, dO, LSE and D of query tile m of item it into buffer buf, by TMA from thread 0,
  // completing on q_full[buf]. Q and dO rows >= T arrive as zeros (outside the tensor);
  // LSE and D rows >= T are the next head's values or zeros (masked queries: unused).
  // LSE and D start at the 16-byte boundary at or before row m·BM (lse_offset floats
  // before it).
  __shared__ alignas(8) uint64_t q_full[2];
  auto issue_q_tile = [&](int bh, int b, int h, int m, int buf) {
    const int lse0 = (bh * p.T + m * BM) & ~3;
    sm90::mbar_arrive_expect_tx(&q_full[buf], 2 * BM * D * sizeof(bf16) + 2 * Tile::kLseBox * sizeof(float));
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      sm90::tma_load_3d(sQ + buf * BM * D + c * BM * 64, &maps.q, &q_full[buf], h * D + c * 64, m * BM, b);
      sm90::tma_load_3d(sdO + buf * BM * D + c * BM * 64, &maps.dout, &q_full[buf], h * D + c * 64, m * BM, b);
    }
    sm90::tma_load_3d(sLse + buf * Tile::kLseStride, &maps.lse, &q_full[buf], lse0, 0, 0);
    sm90::tma_load_3d(sDelta + buf * Tile::kLseStride, &maps.delta, &q_full[buf], lse0, 0, 0);
  };

  int item = int(blockIdx.x) * (kOwner ? n_blocks : 1);
  if (item >= items) return;
  int m = start_m(item);
  if (tid == 0) {
    sm90::mbar_init(&q_full[0], 1);
    sm90::mbar_init(&q_full[1], 1);
    if (kKvBufs == 1) sm90::mbar_init(&kv_full, 3);
    sm90::fence_mbar_init();
  }
  __syncthreads();
  if constexpr (kKvBufs == 2) {
    load_kv(item, 0);
  } else {
    if (tid % 128 == 0) issue_v_rows(item, wg);
    if (tid == 0) issue_k(item);
  }
  cp_async_commit();
  if (tid == 0) {
    const int bh = item_bh(item);
    issue_q_tile(bh, bh / p.H, bh % p.H, m, 0);
    // Ordinal 1 (kLateClaim: now only if the first item is kClaimLead steps long or
    // shorter; else kClaimLead + 1 steps before its end).
    sItem[1] = !kLateClaim || item_steps(item) <= kClaimLead ? claim() : items;
  }

  float dk[Tile::kDTiles][4], dv[Tile::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[dt][i] = dv[dt][i] = 0.f;

  // This warpgroup's 64×64 block of dQ: queries from dq_q0, head-dim columns from dq_d0.
  const int dq_q0 = Tile::kDqSplitsD ? 0 : wg * 64;
  const int dq_d0 = Tile::kDqSplitsD ? wg * 64 : 0;

  // One step = one query tile m of one item. Thread 0 issues the next step's Q tile (TMA)
  // at the start of each step, into the other buffer. Each step commits one cp.async
  // group (owner mode: two, the first this step's dQ partial when it is the tile's last
  // contribution): at an item's first step the next item's K and V (two K/V buffers),
  // else nothing. So an item's first step waits for all groups: the next item's K and V
  // load during the whole of this item. (One K/V buffer: by TMA, on kv_full.)
  int step = 0;  // steps done by this block: the Q buffer is its parity
  // kStageDkDv stages an item's dK and dV (the item's end, below): at D = 64 in sdSt's
  // room, which holds both; at D = 128 (64 KB, sdSt 16 KB) warpgroup 0's in the step's Q
  // and dO buffers and warpgroup 1's in the dQ slot that the TMA has finished reading
  // (80-query tiles, one slot: in sdSt, whose padded rows make 32 KB).
  static_assert(!kStageDkDv || (D == 64 ? 2 * BN * D <= BN * BM
                                         : !kOwner && (kDqBufs == 2 || BN * Tile::kDsCols >= 2 * 64 * D)),
                "dK and dV of the key tile fit the stage");
  // kEarlyKv (one K/V buffer): the next item's K and V load during this item's last
  // step, each once its last reader is done with it (below), rather than at the next
  // item's first step in front of its matmuls. kv_phase: the parity of the items this
  // block has begun (kv_full's phase).
  constexpr bool kEarlyKv = kKvBufs == 1;
  int kv_phase = 0;
  // The current item's key tile, (batch·head), batch and head, worked out once an item,
  // not at every step: the grouped numbering and the head take integer divisions by
  // run-time values.
  int n_block = item_n(item), cur_bh = item_bh(item), cur_b = cur_bh / p.H, cur_h = cur_bh % p.H;
  int ordinal = 0;  // units begun before this one (atomic mode: a unit is an item)
  // TMA dQ: each step writes its dQ tile to shared memory, slot buf (the step parity)
  // with two slots, else slot 0 (dq_slot), and thread kDqThread hands it to the TMA unit
  // in the next step, after its first barrier (the writes are visible then): the tile of
  // query row q0 of (batch·head) bh, added (or, owner mode's first contribution, stored),
  // which it keeps in sDqPending {q0, bh, store} (q0 < 0: none; shared, not registers).
  // kDqThread is the first thread of warpgroup 1, not thread 0, which already issues the
  // query tiles' loads and the claims: every warp waits at each step's barriers for the
  // slowest, and with all of the TMA work warp 0 spent about a quarter of its time in
  // thread 0's code (ncu, D = 128 and 64) while the other warps waited at the barriers.
  // (A bulk-async group belongs to the thread that committed it: the waits for the dQ
  // TMA are this thread's too.)
  constexpr int kDqThread = Tile::kThreads / 2;
  __shared__ int4 sDqPending;
  if (kTmaDq && tid == kDqThread) sDqPending = make_int4(-1, 0, 0, 0);
  auto dq_slot = [](int step_parity) { return kDqBufs == 2 ? step_parity : 0; };
  // The pending tile, written at a step of parity step_parity.
  auto issue_pending_dq = [&](int step_parity) {
    if (tid != kDqThread) return;
    const int4 pending = sDqPending;
    if (pending.x < 0) return;
    const float* tile = sDq + dq_slot(step_parity) * BM * D;
    if constexpr (kFlatDq) {
      // With an L2 evict_last policy: the accumulator's lines are added to again by the
      // other key tiles' items (0.2-1% faster at T = 65,536 than without, "Thirty-second
      // session").
      sm90::bulk_reduce_add_f32(p.dq_accum + (int64_t(pending.y) * m_blocks + pending.x / BM) * (BM * D), tile,
                                BM * D * sizeof(float), sm90::createpolicy_evict_last());
    } else {
      constexpr int kBoxFloats = dq_tile::kBoxBytes / sizeof(float);
#pragma unroll
      for (int rb = 0; rb < BM / dq_tile::kBoxRows; ++rb)
#pragma unroll
        for (int cb = 0; cb < D / dq_tile::kBoxCols; ++cb) {
          const float* box = tile + (rb * (D / dq_tile::kBoxCols) + cb) * kBoxFloats;
          const int c0 = cb * dq_tile::kBoxCols, c1 = pending.x + rb * dq_tile::kBoxRows;
          if (kOwner && pending.z) sm90::tma_store_3d(&maps.dq, box, c0, c1, pending.y);
          else sm90::tma_reduce_add_3d(&maps.dq, box, c0, c1, pending.y);
        }
    }
    sm90::bulk_commit();
    sDqPending.x = -1;  // (owner mode: a step that writes no tile follows)
  };
  // Sᵀ = K·Qᵀ of a step (sm90::issue_abt: this warpgroup's K rows, the step's Q buffer).
  // kPreissueS: each step issues the next step's Sᵀ once its dQ is issued, so that the
  // tensor cores work on it while the warps store the dQ tile and cross the next step's
  // first barrier, where they had nothing to do. The next item's first step included: its
  // K and V were loaded at this item's first step, and its last step waits for them before
  // the dQ barrier. (Issued at one place, the end of a step, and before the loop: with a
  // second, optional issue at the step's start, ptxas serialised every wgmma, C7515.)
  // Without it (D = 128, no registers to spare beside dK and dV; owner mode) each step
  // issues its Sᵀ at its start.
  float s[Tile::kMTiles][4], dp[Tile::kMTiles][4];
  constexpr bool kPreissueS = D == 64 && !kOwner;  // (owner mode: it spilled 24-32 bytes)
  if constexpr (kPreissueS) {  // the first step's
    cp_async_wait<0>();
    sm90::fence_proxy_async();
    __syncthreads();
    sm90::mbar_wait_spin(&q_full[0], 0);
    sm90::wgmma_fence();
    sm90::issue_abt<D, BN, BM>(s, smem_u32(sK) + wg * 64 * 128, smem_u32(sQ));  // K/V buffer 0, Q buffer 0
  }
  for (;;) {
    const int buf = step & 1;
    const bool first_step = m == start_m_of(n_block);
    // K/V buffer: the parity of the items begun before this one.
    const int kv_buf = kKvBufs == 1 ? 0 : (kOwner ? ordinal * n_blocks + n_block : ordinal) & 1;
    // Owner mode: this step's dQ contribution is the query tile's first (a TMA store)
    // or its last (added to the partial, scaled, rounded to bf16 into dqkv).
    const bool dq_first = n_block == 0;
    const bool dq_last = kCausal ? n_block == m * BM / BN : n_block == n_blocks - 1;
    // The step's tiles have landed, every warp is done with the other buffers and with
    // sdSt, and the cp.async writes are visible to the async proxy that wgmma reads through.
    if (first_step) cp_async_wait<0>();
    sm90::mbar_wait_spin(&q_full[buf], (step >> 1) & 1);
    // kStageDkDv: the TMA has read the item before's dK and dV out of their stage, which
    // this step overwrites (D = 64: sdSt, by its dSᵀ; D = 128: thread 0's Q and dO
    // buffers, by the TMA loads it issues below, and kDqThread's dQ slot, by this step's
    // dQ tile).
    if (kStageDkDv && first_step && tid % 128 == 0) sm90::bulk_wait_read<0>();
    sm90::fence_proxy_async();
    __syncthreads();
    if constexpr (kOwner) {
      // The last step's dQ tile, here so that the waits below cover it (tma mode hands it
      // over once this step's matmuls are issued; owner mode measured 1-2% slower so).
      issue_pending_dq(buf ^ 1);
      // The TMA's writes into dQ are complete before the kernel reads them (the partial
      // of a tile's last contribution) or adds to them: the first contributions are
      // stores, all made in the unit's first key tile, and nothing orders a later add to
      // the same place after them but this wait, at the second key tile's first step.
      if ((dq_last && !dq_first) || (n_block == 1 && first_step)) {
        if (tid == kDqThread) {
          sm90::bulk_wait_all();
          sm90::fence_proxy_async_global();
        }
        __syncthreads();
      }
    }
    if constexpr (kKvBufs == 1) {
      // One K/V buffer: the item's K and V have landed (issued at the last step of the
      // item before, or before the loop).
      if (first_step) sm90::mbar_wait_spin(&kv_full, kv_phase);
    }
    if constexpr (kOwner) {
      if (dq_last && !dq_first) {  // the partial of query tile m, by the other contributions
        const int64_t bh = cur_bh;
        constexpr int kChunks = BM * D / 4;  // 16 bytes each
#pragma unroll
        for (int i = tid; i < kChunks; i += Tile::kThreads) {
          const int r = i / (D / 4), c = (i % (D / 4)) * 4, row = m * BM + r;
          cp_async_16(smem_u32(sAcc + r * Tile::kAccStride + c),
                      p.dq_accum + (bh * p.T + (row < p.T ? row : 0)) * D + c, row < p.T);
        }
      }
      cp_async_commit();
    }
    // The next step's query tile: its item and tile (issued below, after this step's matmuls).
    const int next_item = kOwner && n_block + 1 < n_blocks ? item + 1 : sItem[(ordinal + 1) & 1];
    // Whether the item has another query tile (else the next item's first comes next).
    const bool same_item = kDescending ? m > first_m_of(n_block) : m + 1 < m_blocks;
    const int q_item = same_item ? item : next_item;
    // Steps of this item from this one on (kLateClaim).
    const int left = kDescending ? m - first_m_of(n_block) + 1 : m_blocks - m;
    // Two K/V buffers: the next item's K and V kClaimLead steps from this item's end (at
    // its first step if it is that short; owner mode: at its first step). (One K/V buffer:
    // by TMA during this item's last step, below.)
    const bool load_next_now = kLateClaim ? left == min(m_blocks - first_m_of(n_block), kClaimLead) : first_step;
    if (kKvBufs == 2 && load_next_now && next_item < items) load_kv(next_item, kv_buf ^ 1);
    cp_async_commit();

    const int n0 = n_block * BN;
    const int64_t bh = cur_bh;
    const uint32_t q_base = smem_u32(sQ + buf * BM * D), do_base = smem_u32(sdO + buf * BM * D);
    // Rebuilt each step rather than kept live across the loop (no spills at D = 128).
    const uint32_t k_base = sm90::opaque(smem_u32(sK) + kv_buf * (BN * D * 2));
    const uint32_t v_base = sm90::opaque(smem_u32(sV) + kv_buf * (BN * D * 2));
    const uint32_t dst_base = sm90::opaque(smem_u32(sdSt));
    // This warpgroup's 64 keys as the A operand: rows 64·wg.. of column block 0.
    const uint32_t k_rows = k_base + wg * 64 * 128, v_rows = v_base + wg * 64 * 128;
    // (bh·T + q0) mod 4: where row q0 lies in the LSE and D buffers.
    const int lse_offset = ((int(bh) & 3) * (p.T & 3) + m * BM) & 3;
    const float* cLse = sLse + buf * Tile::kLseStride + lse_offset;
    const float* cDelta = sDelta + buf * Tile::kLseStride + lse_offset;
    const int q0 = m * BM;

    // Sᵀ = K·Qᵀ, then dPᵀ = V·dOᵀ, in two commit groups, so that the softmax starts on Sᵀ
    // while the tensor cores still work on dPᵀ.
    sm90::wgmma_fence();
    if constexpr (!kPreissueS) sm90::issue_abt<D, BN, BM>(s, k_rows, q_base);
    sm90::issue_abt<D, BN, BM>(dp, v_rows, do_base);
    // The TMA work, behind the issuing warpgroup's share of this step's matmuls rather
    // than in front of it: thread 0, the next step's query tile into the other buffer
    // (free since the barrier above); tma mode, kDqThread, the last step's dQ tile
    // (written before that barrier).
    if (tid == 0 && q_item < items) {
      if (same_item) {
        issue_q_tile(cur_bh, cur_b, cur_h, m + kMStep, buf ^ 1);
      } else {
        const int bh = item_bh(next_item);
        issue_q_tile(bh, bh / p.H, bh % p.H, start_m(next_item), buf ^ 1);
      }
    }
    if constexpr (kTmaDq && !kOwner && !Tile::kEagerDq) issue_pending_dq(buf ^ 1);
    // The claim of the item after next (ordinal + 2), while the tensor cores work on Sᵀ
    // and dPᵀ; the number goes to its slot just before the dQ barrier, so that warp 0
    // waits for the atomic's round trip only if the softmax took less (a store right
    // behind the atomic held warp 0, and with it the block at the barrier, for all of it),
    // and is read after the next step's barrier (thread 0 wrote the other slot).
    int claimed = -1;
    bool claimed_next = false;  // kLateClaim: the claim is the next item's (ordinal + 1)
    if constexpr (kLateClaim) {
      if (tid == 0) {
        if (left == kClaimLead + 1) {
          claimed = claim(), claimed_next = true;  // read at the step that loads its K and V
        } else if (left == 1 && next_item < items && item_steps(next_item) <= kClaimLead) {
          claimed = claim();  // the item after a next item of kClaimLead steps or fewer
        }
      }
    } else {
      if (tid == 0 && first_step && (!kOwner || n_block == 0) && sItem[(ordinal + 1) & 1] < items) claimed = claim();
    }
    sm90::wgmma_wait<1>();
    sm90::fence_accumulators(s);

    // Pᵀ = exp2(Sᵀ·scale·log2e − LSE·log2e); masked: queries >= T, keys >= T and
    // (causal) keys after the query. Accumulator row = key, column = query.
    const bool needs_mask = q0 + BM > p.T || n0 + BN > p.T || (kCausal && n0 + BN - 1 > q0);
    if constexpr (D == 64) {
      // A key row sees the queries from its own position (causal; else 0) to T − 1, none
      // if the key is >= T: as offsets c = 8·nt + (i & 1) from this thread's first column
      // q0 + 2t, first <= c <= last, two compares a score against constants of the
      // unrolled loop (about 2.5 instructions a masked score against 4.5), then one
      // exponential loop, where ptxas had compiled a masked and an unmasked copy: 1.4-5%
      // faster at D = 64 under a causal mask; at D = 128 0.3-1.8% slower (8K and 16K
      // causal), so the per-score test stays there (BENCHMARKS.md, "Forty-fifth session").
      if (needs_mask) {
        const int last = p.T - 1 - q0 - 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = n0 + warp_key0 + g + h * 8;
          const int first = key >= p.T ? BM : (kCausal ? key : 0) - q0 - 2 * t;
#pragma unroll
          for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              if (nt * 8 + j < first || nt * 8 + j > last) s[nt][2 * h + j] = -INFINITY;
        }
      }
#pragma unroll
      for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s[nt][i] = fast_exp2(fmaf(s[nt][i], p.scale_log2, -cLse[nt * 8 + 2 * t + (i & 1)] * kLog2e));
    } else {
#pragma unroll
      for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = nt * 8 + 2 * t + (i & 1);
          float x = s[nt][i];
          if (needs_mask) {
            const int key = n0 + warp_key0 + g + (i >> 1) * 8, qry = q0 + col;
            if (qry >= p.T || key >= p.T || (kCausal && key > qry)) x = -INFINITY;
          }
          s[nt][i] = fast_exp2(fmaf(x, p.scale_log2, -cLse[col] * kLog2e));
        }
    }
    // Pᵀ and dSᵀ as bf16 A fragments (k-step kk = queries 16kk..) for dV += Pᵀ·dO and
    // dK += dSᵀ·Q (k-step kk is queries 16kk.. = 16 rows of 128 bytes; the head dim spans
    // D/64 column blocks, BM·128 bytes apart: the leading-dimension offset, MN-major).
    // kSpreadDkDv (TMA dQ at D = 128): dV is issued before dPᵀ is waited for, so that it
    // runs while dPᵀ finishes and dSᵀ is computed, and dK behind dQ, so that it runs while
    // dQ goes to shared memory. At D = 64 either order spills (Pᵀ's or dSᵀ's registers
    // stay live longer) and both are issued together once dSᵀ is ready.
    constexpr bool kSpreadDkDv = kTmaDq && D == 128;
    static_assert(!kEarlyKv || kSpreadDkDv, "the early loads sit behind kSpreadDkDv's waits");
    const bool load_next_kv = kEarlyKv && !same_item && next_item < items;
    static_assert(!(kPreissueS && kSpreadDkDv), "a pre-issued Sᵀ would sit between dQ and dK");
    uint32_t pa[BM / 16][4], dsa[BM / 16][4];
    auto issue_dv = [&] {
      const uint64_t do_desc_t = sm90::make_desc(do_base, BM * 128, sm90::kSwizzleAtom);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::wgmma_rs_tb<D>(dv, pa[kk], sm90::desc_advance(do_desc_t, kk * 16 * 128));
    };
    auto issue_dk = [&] {
      const uint64_t q_desc_t = sm90::make_desc(q_base, BM * 128, sm90::kSwizzleAtom);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::wgmma_rs_tb<D>(dk, dsa[kk], sm90::desc_advance(q_desc_t, kk * 16 * 128));
    };
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) c_pair_to_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
    if constexpr (kSpreadDkDv) {
      sm90::wgmma_fence();
      issue_dv();
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // dPᵀ done; dV may still run
      if (load_next_kv && tid % 128 == 0) issue_v_rows(next_item, wg);  // this warpgroup's V rows: read for the last time
    } else {
      sm90::wgmma_wait<0>();
    }
    sm90::fence_accumulators(dp);
    // dSᵀ = Pᵀ ∘ (dPᵀ − D) as bf16 A fragments.
#pragma unroll
    for (int nt = 0; nt < Tile::kMTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dp[nt][i] = s[nt][i] * (dp[nt][i] - cDelta[nt * 8 + 2 * t + (i & 1)]);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) c_pair_to_a(dsa[kk], dp[2 * kk], dp[2 * kk + 1]);
    if constexpr (!kSpreadDkDv) {
      sm90::wgmma_fence();
      issue_dv();
      issue_dk();
      sm90::wgmma_commit();
    }

    // dSᵀ → shared memory while dV (and, but for kSpreadDkDv, dK) run. A fragment register
    // r of k-step kk holds the bf16 pair (row g + 8·(r&1), columns 16kk + 8·(r>>1) + 2t, +1):
    // register r of every lane is the 8x8 matrix of rows 8·(r&1).. and columns 16kk +
    // 8·(r>>1).., so one stmatrix a k-step stores them all; lane l gives the address of row
    // l%8 of matrix l/8 (a 16-byte chunk of the swizzled tile).
    // (tile_offset's 16-byte chunk of column 16kk + 8·(mat>>1) is 2kk mod 8 XOR x below.)
    {
      const int mat = lane >> 3, row = warp_key0 + 8 * (mat & 1) + (lane & 7), x = (mat >> 1) ^ (lane & 7);
      const uint32_t row_addr = dst_base + row * 128;
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::stmatrix_x4(row_addr + (kk >> 2) * (BN * 128) + (((2 * kk) & 7) ^ x) * 16, dsa[kk]);
    }
    if constexpr (kSpreadDkDv) {  // dV: done with Pᵀ's registers before dQ needs registers
      sm90::wgmma_wait<0>();
      sm90::fence_accumulators(dv);
    }
    if constexpr (kOwner) cp_async_wait<1>();  // this step's dQ partial (if any) has landed
    else if (kPreissueS && !same_item) cp_async_wait<0>();  // the next item's K and V, for the next Sᵀ
    // TMA dQ: the reduce that last read this step's dQ slot is done reading it (issued
    // a step ago with two slots; with one, at this step's start).
    if constexpr (kTmaDq && !Tile::kEagerDq)
      if (tid == kDqThread) sm90::bulk_wait_read<kDqBufs - 1>();
    if (claimed >= 0) sItem[(ordinal + claimed_next) & 1] = claimed;  // (thread 0 only)
    sm90::fence_proxy_async();  // st.shared above, read next by wgmma (async proxy)
    __syncthreads();            // dQ needs the dSᵀ of both warpgroups (owner: and sAcc)

    // dQ (this warpgroup's 64×64 block) = dS·K over all BN keys: k-step kk is keys
    // 16kk.. = 16 rows of 128 bytes of both dSᵀ (column block dq_q0/64) and K (column
    // block dq_d0/64); both MN-major. TMA dQ (tma and owner modes): dQᵀ = Kᵀ·dSᵀ
    // instead, the same two operands swapped, so that each register's stores below meet
    // 32 banks (atomic mode keeps dQ: its float2 atomics go to global memory).
    float dq[Tile::kDqTiles][4];
    const uint64_t ds_desc_t = sm90::make_desc(dst_base + (dq_q0 / 64) * BN * 128, BN * 128, sm90::kSwizzleAtom);
    const uint64_t k_desc_t = sm90::make_desc(k_base + (dq_d0 / 64) * BN * 128, BN * 128, sm90::kSwizzleAtom);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t ds = sm90::desc_advance(ds_desc_t, kk * 16 * 128), kd = sm90::desc_advance(k_desc_t, kk * 16 * 128);
      sm90::wgmma_ss_t<Tile::kDqTiles * 8, /*kTransA=*/1, /*kTransB=*/1>(dq, kTmaDq ? kd : ds, kTmaDq ? ds : kd,
                                                                       /*accumulate=*/kk > 0);
    }
    sm90::wgmma_commit();
    if constexpr (kPreissueS) {
      // The next step's Sᵀ: its Q tile was issued at this step's start; its K is this
      // item's or (the item's last step) the next item's, in the other K/V buffer. After
      // the block's last step there is no next tile: the matmul then reads what the
      // buffers hold, and its result is never used.
      const uint32_t k_next = same_item ? k_rows : sm90::opaque(smem_u32(sK) + (kv_buf ^ 1) * (BN * D * 2)) + wg * 64 * 128;
      if (q_item < items) sm90::mbar_wait_spin(&q_full[buf ^ 1], ((step + 1) >> 1) & 1);
      sm90::issue_abt<D, BN, BM>(s, k_next, smem_u32(sQ + (buf ^ 1) * BM * D));
    }
    if constexpr (kSpreadDkDv) {
      sm90::wgmma_fence();
      issue_dk();
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // dQ
      if (load_next_kv) {  // K, once both warpgroups' dQ has read all of it
        sm90::named_sync(1, Tile::kThreads);
        if (tid == 0) issue_k(next_item);
      }
    } else {
      sm90::wgmma_wait<kPreissueS ? 1 : 0>();  // dV, dK and dQ (the next Sᵀ may still run)
      sm90::fence_accumulators(dv);
    }
    sm90::fence_accumulators(dq);

    if (kTmaDq && !(kOwner && dq_last)) {
      if constexpr (kFlatDq) {
        // This warpgroup's block of dQᵀ (64×64, or 80 queries × 64 columns) in register
        // order: quad j of every thread of a warp is 512 consecutive bytes (dq_tile.h's
        // flat tile).
        // kEagerDq (80-query tiles, one slot): the reduce-add of this warpgroup's block of
        // the step before (the warpgroup's first thread issued it) has read it; the block
        // goes to the TMA once all four warps have written it.
        if constexpr (Tile::kEagerDq) {
          if (tid % 128 == 0) sm90::bulk_wait_read<0>();
          sm90::named_sync(2 + wg, 128);
        }
        const uint32_t block = smem_u32(sDq) + (dq_slot(buf) * BM * D + wg * dq_tile::flat_block_floats(D, BM)) * 4;
        const uint32_t base = sm90::opaque(block + dq_tile::flat_index(tid % 128, 0) * 4);
#pragma unroll
        for (int j = 0; j < Tile::kDqTiles; ++j) st_shared_v4_f32(base + dq_tile::flat_index(0, j) * 4, dq[j]);
        if constexpr (Tile::kEagerDq) {
          sm90::fence_proxy_async();
          sm90::named_sync(2 + wg, 128);
          if (tid % 128 == 0) {
            constexpr int kBlockFloats = dq_tile::flat_block_floats(D, BM);
            sm90::bulk_reduce_add_f32(p.dq_accum + (bh * m_blocks + m) * (BM * D) + wg * kBlockFloats,
                                      sDq + dq_slot(buf) * BM * D + wg * kBlockFloats, kBlockFloats * sizeof(float),
                                      sm90::createpolicy_evict_last());
            sm90::bulk_commit();
          }
        }
      } else {
        // This warpgroup's 64×64 block into the tile's boxes (64 rows × 32 columns, 128-byte
        // rows whose 16-byte chunks are XOR-swizzled by row % 8, as the TMA reads them);
        // rows >= T too (the TMA skips them). (The tile's address is laundered: hoisted out
        // of the loop, it spilled.)
        // Where each register of dQᵀ goes: dq_tile.h (its CPU tests check every lane's
        // address, and that a warp store meets the 32 banks once: one wavefront).
        const uint32_t tile = smem_u32(sDq) + dq_slot(buf) * BM * D * 4;
        const dq_tile::Transposed lane = dq_tile::transposed(D, dq_q0, dq_d0, warp % 4, g, t);
        const uint32_t base = sm90::opaque(tile + lane.lane_base);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const uint32_t at = base + dq_tile::transposed_offset(lane.x, h, e);
#pragma unroll
            for (int j = 0; j < 8; ++j) st_shared_f32(at + j * 8 * dq_tile::kRowBytes, dq[j][2 * h + e]);
          }
      }
      if (!Tile::kEagerDq && tid == kDqThread) sDqPending = make_int4(q0, int(bh), kOwner && dq_first, 0);
    }
    if constexpr (kOwner) {
      // The last contribution: dQᵀ's registers (dq[j][2h + e] is query row dq_q0 + 8j + 2t
      // + e, column dq_d0 + 16·(warp % 4) + 8h + g, dq_tile.h) plus the partial that the
      // other threads copied in after the step's barrier, scaled, to bf16 in dqkv. (The
      // partial's reads meet 32 banks: rows 2t apart are 8t banks apart, kAccStride = D + 4.)
      if (dq_last) {
        const int col = dq_d0 + 16 * (warp % 4) + g, r0 = dq_q0 + 2 * t;
        bf16* out = p.dqkv + (int64_t(cur_b) * p.T + q0 + r0) * p.qkv_row_stride + int64_t(cur_h) * D + col;
        const float* part = sAcc + r0 * Tile::kAccStride + col;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 8 * j + e;  // from r0
            if (q0 + r0 + r >= p.T) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              float x = dq[j][2 * h + e];
              if (!dq_first) x += part[r * Tile::kAccStride + 8 * h];
              out[int64_t(r) * p.qkv_row_stride + 8 * h] = __float2bfloat16_rn(x * p.scale);
            }
          }
      }
    } else if constexpr (!kTmaDq) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int qry = q0 + dq_q0 + (warp % 4) * 16 + g + 8 * half;
        if (qry >= p.T) continue;
        float* dst = p.dq_accum + (bh * p.T + qry) * D + dq_d0 + 2 * t;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt) atomic_add_pair(dst + dt * 8, dq[dt][2 * half], dq[dt][2 * half + 1]);
      }
    }

    if constexpr (kSpreadDkDv) sm90::wgmma_wait<0>();  // dK
    sm90::fence_accumulators(dk);
    ++step;
    if (kDescending ? --m >= first_m_of(n_block) : ++m < m_blocks) continue;  // = same_item (the flag itself compiled differently)

    // The item's last step: dK·scale and dV → bf16 into the K and V slots of dqkv
    // (B,T,3,H,D), and the accumulators start again for the next item.
    if constexpr (kStageDkDv) {
      // Warpgroup wg's keys: its dK and its dV, each D/64 boxes of 64 rows × 64 columns
      // (sm90::stage_accumulator_bf16), once both warpgroups are done with the step (its
      // dQ read all of dSᵀ and K, its dK and dV all of Q and dO); keys >= T are not stored.
      // D = 64: both warpgroups in sdSt (32 KB). D = 128 (64 KB): warpgroup 0 in this
      // step's Q and dO buffers, whose next load thread 0 issues at the next step, and
      // warpgroup 1 (whose first thread is kDqThread) in the dQ slot of the step before,
      // once the reduce-add that kDqThread issued at this step's start has read it (this
      // step's dQ tile waits in the other slot). The next item's first step waits for the
      // TMA to have read them.
      if (D == 128 && kDqBufs == 2 && tid == kDqThread) sm90::bulk_wait_read<0>();
      __syncthreads();
      bf16 *dk_tile, *dv_tile;
      if constexpr (D == 64) {
        dk_tile = sdSt + wg * 2 * 64 * D;
        dv_tile = dk_tile + 64 * D;
      } else {
        dk_tile = wg == 0      ? sQ + buf * BM * D
                  : kDqBufs == 2 ? reinterpret_cast<bf16*>(sDq + dq_slot(buf ^ 1) * BM * D)
                                 : sdSt;  // (80-query tiles: one dQ slot; the padded dSᵀ holds the 32 KB)
        dv_tile = wg == 0 ? sdO + buf * BM * D : dk_tile + 64 * D;
      }
      // (Laundered: hoisted out of the loop, the address spilled.)
      const uint32_t dk_addr = sm90::opaque(smem_u32(dk_tile)), dv_addr = sm90::opaque(smem_u32(dv_tile));
      sm90::stage_accumulator_bf16(dk_addr, 64 * 128, warp % 4, lane, dk, p.scale, p.scale);
      sm90::stage_accumulator_bf16(dv_addr, 64 * 128, warp % 4, lane, dv, 1.f, 1.f);
      sm90::fence_proxy_async();
      sm90::named_sync(2 + wg, 128);
      if (tid % 128 == 0) {
        const int key0 = n0 + wg * 64;
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
          sm90::tma_store_3d(&maps.dqkv, dk_tile + c * 64 * 64, (p.H + cur_h) * D + c * 64, key0, cur_b);
          sm90::tma_store_3d(&maps.dqkv, dv_tile + c * 64 * 64, (2 * p.H + cur_h) * D + c * 64, key0, cur_b);
        }
        sm90::bulk_commit();
      }
    } else {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = n0 + warp_key0 + g + 8 * half;
      if (key >= p.T) continue;
      bf16* dk_dst = p.dqkv + (int64_t(cur_b) * p.T + key) * p.qkv_row_stride + int64_t(p.H + cur_h) * D + 2 * t;
      bf16* dv_dst = dk_dst + int64_t(p.H) * D;
#pragma unroll
      for (int dt = 0; dt < Tile::kDTiles; ++dt) {
        *reinterpret_cast<uint32_t*>(dk_dst + dt * 8) =
            pack_bf16(dk[dt][2 * half] * p.scale, dk[dt][2 * half + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_dst + dt * 8) = pack_bf16(dv[dt][2 * half], dv[dt][2 * half + 1]);
      }
    }
    }
    if (kOwner && n_block + 1 < n_blocks) {
      ++item;  // the unit's next key tile
    } else {
      item = sItem[(ordinal + 1) & 1];  // not written this step (thread 0 wrote the other)
      ++ordinal;
    }
    if (item >= items) break;
    kv_phase ^= 1;
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dk[dt][i] = dv[dt][i] = 0.f;
    n_block = item_n(item);
    cur_bh = item_bh(item);
    cur_b = cur_bh / p.H;
    cur_h = cur_bh % p.H;
    m = start_m_of(n_block);
  }
  if constexpr (kPreissueS) sm90::wgmma_wait<0>();  // the Sᵀ issued after the last step
  if (kStageDkDv && tid % 128 == 0) sm90::bulk_wait_read<0>();  // the shared memory stays until the TMA has read it
  if constexpr (kTmaDq) {  // the last tile, and shared memory stays until it is read
    sm90::fence_proxy_async();
    __syncthreads();
    issue_pending_dq((step - 1) & 1);
    if (tid == kDqThread || (Tile::kEagerDq && tid % 128 == 0)) sm90::bulk_wait_all();
  }
#else
  static_assert(Tile::kMTiles > 0 && Tile::kDTiles > 0, "tile shape");
  __trap();  // never launched: the dispatcher checks that sm_90a code was built
#endif
}

template <class Tile, bool kCausal, bool kOwner, bool kTmaDq, bool kFlatDq = false, bool kStageDkDv = false>
void launch_main(const FlashParams& p, int64_t grid, cudaStream_t stream) {
  auto kernel = flash_bwd_sm90_kernel<Tile, kCausal, kOwner, kTmaDq, kFlatDq, kStageDkDv>;
  constexpr size_t smem = Tile::smem_bytes(kOwner, kTmaDq);
  static const bool opted_in = opt_in_dynamic_smem(kernel, smem);  // once
  (void)opted_in;
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM;
  Sm90BwdMaps maps{};
  maps.q = bf16_rows_tensor_map(p.qkv, p.qkv_row_stride, p.T, p.B, BM, "qkv");
  maps.dout = bf16_rows_tensor_map(p.dout, p.o_row_stride, p.T, p.B, BM, "dout");
  if constexpr (Tile::kKvMap) maps.kv = bf16_rows_tensor_map(p.qkv, p.qkv_row_stride, p.T, p.B, 64, "qkv");
  if constexpr (kStageDkDv) maps.dqkv = bf16_rows_tensor_map(p.dqkv, p.qkv_row_stride, p.T, p.B, 64, "dqkv");
  {
    // Flat (B·H·T): the box at the 16-byte boundary at or before element bh·T + m·BM, so
    // no alignment is asked of T. The two outer dimensions are 1 (their strides only have
    // to be valid: 16-byte multiples). TMA coordinates are 32-bit signed.
    const uint64_t n = uint64_t(p.B) * p.H * uint64_t(p.T);
    if (n + Tile::kLseBox > uint64_t(INT32_MAX))
      fail_input("the sm90 attention backward takes B·H·T < 2^31 (got ", n, "); use FLASHGPT_ATTENTION_PATH=sm80");
    const uint64_t dims[3] = {n, 1, 1};
    const uint64_t stride = (n * sizeof(float) + 15) / 16 * 16;
    const uint64_t strides[2] = {stride, stride};
    const uint32_t box[3] = {Tile::kLseBox, 1, 1};
    maps.lse = tensor_map_3d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.lse, dims, strides, box, "LSE",
                             CU_TENSOR_MAP_SWIZZLE_NONE);
    maps.delta = tensor_map_3d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.delta, dims, strides, box, "delta",
                               CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  if constexpr (kTmaDq && !kFlatDq) {  // the (B·H, T, D) fp32 accumulator
    const uint64_t dims[3] = {uint64_t(D), uint64_t(p.T), uint64_t(p.B) * p.H};
    const uint64_t strides[2] = {uint64_t(D) * sizeof(float), uint64_t(D) * sizeof(float) * uint64_t(p.T)};
    const uint32_t box[3] = {dq_tile::kBoxCols, dq_tile::kBoxRows, 1};
    maps.dq = tensor_map_3d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.dq_accum, dims, strides, box, "dQ accumulator");
  }
  kernel<<<unsigned(grid), Tile::kThreads, smem, stream>>>(maps, p);
  CUDA_CHECK_LAUNCH();
}

// Flat mode's postprocess: one block per (batch·head, query tile); its accumulator region
// (BM·D floats in dq_tile.h's flat order) read in float4s, scaled, rounded to bf16 into a
// shared-memory tile at each element's place (rows padded by 16 bytes: the four rows of a
// warp's store meet different banks), then written to dqkv a row of D at a time. The
// blocks take the tiles in reverse, last first: the main kernel's last head group added
// to those last, so they are the ones still in the L2 (the preprocess's comment has the
// gain).
constexpr int kFlatPostThreads = 256;  // the flat postprocess's block
template <class Tile>
__global__ void __launch_bounds__(kFlatPostThreads) flash_bwd_flat_dq_postprocess_kernel(const FlashParams p) {
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, kStride = D + 8;
  __shared__ alignas(16) bf16 sOut[BM * kStride];
  const int m_blocks = (p.T + BM - 1) / BM;
  const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int64_t bh = tile / m_blocks;
  const int m = int(tile % m_blocks);
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + tile * BM * D);
  // A thread's float4s all loaded before any is stored, rather than 4 at a time: on an
  // H200 a first version 0.1-0.3% faster backward at T = 1K-2K (three rounds), this one
  // level to 0.3% faster (two rounds; BENCHMARKS.md, "Forty-third session", calls 6-7).
  constexpr int kPer = BM * D / 4 / kFlatPostThreads;
  static_assert(kPer * kFlatPostThreads * 4 == BM * D, "whole float4s a thread");
  float4 x[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) x[j] = src[threadIdx.x + kFlatPostThreads * j];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    // floats 4k + r: rows + (r & 1), columns + 8·(r >> 1)
    const dq_tile::Element e = dq_tile::flat_element(4 * (threadIdx.x + kFlatPostThreads * j), D, BM);
    bf16* o = sOut + e.q * kStride + e.c;
    o[0] = __float2bfloat16_rn(x[j].x * p.scale);
    o[kStride] = __float2bfloat16_rn(x[j].y * p.scale);
    o[8] = __float2bfloat16_rn(x[j].z * p.scale);
    o[kStride + 8] = __float2bfloat16_rn(x[j].w * p.scale);
  }
  __syncthreads();
  const int b = int(bh / p.H), h = int(bh % p.H);
  for (int k = threadIdx.x; k < BM * D / 8; k += blockDim.x) {
    const int q = k / (D / 8), c = (k % (D / 8)) * 8, row = m * BM + q;
    if (row >= p.T) continue;
    *reinterpret_cast<uint4*>(p.dqkv + (int64_t(b) * p.T + row) * p.qkv_row_stride + int64_t(h) * D + c) =
        *reinterpret_cast<const uint4*>(sOut + q * kStride + c);
  }
}

// Flat mode: the preprocess, the main kernel and the postprocess with query tiles of
// Tile::kBlockM rows.
template <class Tile, bool kCausal>
void launch_flat(const FlashParams& p, int64_t grid, cudaStream_t stream) {
  constexpr int D = Tile::kHeadDim;
  // The accumulator: BM·D floats a (batch·head, query tile), the last tile's rows past T
  // too (zeroed by the preprocess).
  const int64_t tiles = int64_t(p.B) * p.H * ((p.T + Tile::kBlockM - 1) / Tile::kBlockM);
  launch_bwd_preprocess<D>(p, /*zero_floats=*/tiles * Tile::kBlockM * D, stream);  // and the work counter
  if (stages_dk_dv(DqMode::flat, D, p.T, kCausal))
    launch_main<Tile, kCausal, /*kOwner=*/false, /*kTmaDq=*/true, /*kFlatDq=*/true, /*kStageDkDv=*/true>(p, grid,
                                                                                                      stream);
  else
    launch_main<Tile, kCausal, /*kOwner=*/false, /*kTmaDq=*/true, /*kFlatDq=*/true>(p, grid, stream);
  flash_bwd_flat_dq_postprocess_kernel<Tile><<<unsigned(tiles), kFlatPostThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <int kHeadDim, bool kCausal>
void launch_bwd_sm90(const FlashParams& p, int max_blocks, DqMode dq, cudaStream_t stream) {
  using Config = Sm90BwdConfig<kHeadDim>;
  using Tile = typename Config::Tile;
  const bool owner = dq == DqMode::owner;
  // flash_attention.cu checks that the item count fits in an int.
  const int64_t units = owner ? int64_t(p.B) * p.H : int64_t((p.T + Tile::kBlockN - 1) / Tile::kBlockN) * p.B * p.H;
  const int64_t grid = max_blocks > 0 ? std::min<int64_t>(units, max_blocks) : units;
  if (dq == DqMode::flat) {
    // Without a mask at D = 128, 80-query tiles (FullFlatTile), as FlashAttention-3.
    launch_flat<std::conditional_t<kCausal, Tile, typename Config::FullFlatTile>, kCausal>(p, grid, stream);
    return;
  }
  // The accumulator: (B·H, T, D) floats (owner mode needs none).
  launch_bwd_preprocess<kHeadDim>(p, /*zero_floats=*/owner ? 0 : int64_t(p.B) * p.H * p.T * kHeadDim, stream);
  if (owner) {
    launch_main<Tile, kCausal, /*kOwner=*/true, /*kTmaDq=*/true>(p, grid, stream);
    return;  // dQ is written in bf16 by the kernel: no postprocess
  }
  if (dq == DqMode::tma && stages_dk_dv(dq, kHeadDim, p.T, kCausal))  // (D = 128 only)
    launch_main<Tile, kCausal, /*kOwner=*/false, /*kTmaDq=*/true, /*kFlatDq=*/false, /*kStageDkDv=*/kHeadDim == 128>(
        p, grid, stream);
  else if (dq == DqMode::tma) launch_main<Tile, kCausal, /*kOwner=*/false, /*kTmaDq=*/true>(p, grid, stream);
  else launch_main<Tile, kCausal, /*kOwner=*/false, /*kTmaDq=*/false>(p, grid, stream);
  launch_bwd_postprocess<kHeadDim>(p, stream);
}

template void launch_bwd_sm90<64, /*kCausal=*/true>(const FlashParams&, int, DqMode, cudaStream_t);
template void launch_bwd_sm90<64, /*kCausal=*/false>(const FlashParams&, int, DqMode, cudaStream_t);
template void launch_bwd_sm90<128, /*kCausal=*/true>(const FlashParams&, int, DqMode, cudaStream_t);
template void launch_bwd_sm90<128, /*kCausal=*/false>(const FlashParams&, int, DqMode, cudaStream_t);

}  // namespace flashgpt::cuda::attn
