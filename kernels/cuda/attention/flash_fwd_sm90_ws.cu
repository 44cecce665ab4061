// FlashAttention forward, Hopper path with warp specialisation (sm_90a), the structure of
// FlashAttention-3's forward: FLASHGPT_ATTENTION_PATH=sm90ws.
//
// One block = a producer warpgroup and kConsumers = 2 (or, at D = 64, tile 1: 3; the
// default there unless causal with T < 2048, tile_choice.h) consumer warpgroups for
// 64·kConsumers query rows:
//   producer (warpgroup 0, 24 registers a thread after setmaxnreg): one thread issues TMA
//     loads (cp.async.bulk.tensor through a 3-D tensor map over qkv viewed as
//     (3·H·D, T, B), boxes of 64 columns × kBlockN rows, 128B swizzle: exactly the wgmma
//     tile layout; rows past T arrive as zeros): the Q tile (kQRows rows) once, then K and V
//     tiles into two rings of kStages buffers, each buffer with a "full" mbarrier (the TMA bytes) and an "empty"
//     one (all the consumer threads are done reading it);
//   consumers (warpgroups 1.., 240 registers, 160 with three): 64 query rows each, the pipelined
//     schedule of flash_fwd_sm90_consumer.cuh (QKᵀ of tile j with P·V of tile j−1, the
//     softmax of j under it), with no block-wide barrier. They take turns (named barriers
//     1.., "ping-pong" with two, round robin with three): a consumer issues its matmuls,
//     and once its QKᵀ is done hands the turn to the next, so that the others' softmax
//     runs while one's matmuls hold the tensor cores. A consumer's output (O / l, bf16)
//     goes by stmatrix into a stage in shared memory and from there by one TMA store
//     (store_output_tma), but in the D = 64 persistent kernels (their own global stores).
// A block per query tile (the grid), or for the two- and three-consumer 128-key tiles one
// block an SM walking the tiles (the persistent kernel below; auto's at short sequences,
// tile_choice.h). Without a mask the grid's three consumers split the key tiles of a
// short last query tile of one consumer's rows between them (tile_choice.h's
// sm90ws_splits_keys).
// The arithmetic is the sm90 forward's (flash_fwd_sm90.cu); with 128-key tiles in the same
// order too, at both head dims and with two or three consumers: the same bits
// (CudaFlashAttention.Sm90WsForwardIsBitwiseEqualToSm90; a 192-row block's consumers run
// only the key tiles they see part of, as sm90's rows do). The
// fastest forward on an H200 at every benchmarked shape (BENCHMARKS.md): auto's forward on
// Hopper.
#include <cuda.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <type_traits>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/flash_fwd_sm90_consumer.cuh"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/tile_choice.h"
#include "kernels/cuda/attention/tma_sm90.cuh"

namespace flashgpt::cuda::attn {
namespace {

// Key tiles of 128 (the default at both head dims), or at D = 128 tile 1's 176 (auto's
// without a mask from T = 8192, tile_choice.h: FlashAttention-3's tile there; two K/V
// stages, a quarter fewer steps a query tile for the same matmul work, S in 88 registers
// a thread; it replaced a 64-key tile that was 16-24% slower than 128, BENCHMARKS.md
// "Twelfth session" and "Thirty-third session").
// kConsumers = 3 (D = 64, tile 1): 192 query rows a block, as FlashAttention-3 runs head
// dim 64: while one consumer's matmuls run, two others can be in their softmax. The
// registers then split 24 (producer) / 160 (consumers). Every tile runs the overlapped
// step: until the twelfth session it spilled at D = 128 with 128-key tiles and with three
// consumers (ptxas held the consumers to 168 and 128 registers, see mbar_wait), and those
// tiles ran their two matmuls one at a time (the overlap is 8-21% faster at D = 128, -1
// to +7% with three consumers).
// kConsumers = 1 (tile kSm90WsOneConsumer: auto's at D = 64 without a mask below T = 320
// (with a causal mask tile 0 persistent is faster there), anywhere with
// FLASHGPT_ATTENTION_FWD_CONSUMERS=1): 64 query rows a block and two blocks an SM
// (registers 24 / 232, two K/V stages, 64-key tiles at D = 128), so that one block's
// first loads and epilogue run under the other's matmuls at short sequences, where a
// block's tile has few key tiles. Three stages at D = 64 take 113 KB a block, one block an
// SM: Q comes in the K/V map's boxes of kBlockN rows, so a 64-row block holds a 128-row Q
// tile (kQRows). With Q in a map of its own two such blocks fit, and they ran no faster
// than two stages (BENCHMARKS.md, "Twenty-fourth session", calls 3-4).
template <int kHeadDim_, int kBlockN_ = 128, int kConsumers_ = 2, int kQBufs_ = 1>
struct Sm90WsTile : Sm90FwdTileShape<kHeadDim_, kBlockN_, 64 * kConsumers_> {
  using Shape = Sm90FwdTileShape<kHeadDim_, kBlockN_, 64 * kConsumers_>;
  static constexpr int kConsumers = kConsumers_;
  // Q buffers of the persistent kernel (1 or 2). With two, the producer loads a tile's Q
  // while the consumers still read the tile before's from the other buffer; with one it
  // waits for their last QKᵀ of that tile, and the next tile's first step waits for the
  // load. Two at D = 128 (tile 0), in two K/V stages (the shared memory holds two Q tiles
  // and three stages at D = 64 only): 1.6-3.5% faster at 1K causal and full and 2K causal,
  // 1.1% slower at 2K full. At D = 64, with three stages, 3.7% slower at 1K causal, and
  // 12-14% with three consumers (2K-8K causal), where it spilled ("Thirty-third session",
  // call 4); since the next tile's first QKᵀ goes with the last P·V (step_across), level
  // with three stages and 3-6% slower with two at 512-1K causal on an H100 ("Sixty-first
  // session", call 1).
  static constexpr int kQBufs = kQBufs_;
  static_assert(kQBufs_ == 1 || kQBufs_ == 2, "one or two Q buffers");
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer + consumer warpgroups
  static constexpr int kBlocksPerSm = kConsumers == 1 ? 2 : 1;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 1 ? 232 : kConsumers == 2 ? 240 : 160;
  // Two stages for one consumer (two blocks' shared memory), for 176-key tiles and with two
  // Q buffers (three would not fit), three otherwise.
  static constexpr int kStages = kConsumers == 1 || kBlockN_ > 128 || kQBufs == 2 ? 2 : 3;
  // The overlapped step's softmax split around the wait for the previous P·V
  // (Sm90FwdConsumer): with two consumers, where on an H200 it ran 1.5-2.3% faster in the
  // forward at D = 64 causal 1K (GPT-2's), D = 128 full 1K and 8K (176-key tiles) and
  // D = 128 causal 16K, and was level (-0.6%) at D = 128 causal 1K; with three consumers
  // (D = 64 causal from 2K, full from 320) 1.1-1.9% slower (BENCHMARKS.md, "Fifty-second
  // session", call 1). One consumer: not measured, the old step.
  static constexpr bool split_softmax() { return kConsumers == 2; }
  static constexpr uint32_t kTileBytes = uint32_t(Shape::kBlockN) * kHeadDim_ * sizeof(bf16);
  static constexpr uint32_t kQBytes = uint32_t(Shape::kQRows) * kHeadDim_ * sizeof(bf16);
  // kQBufs × Q + kStages × (K, V), and slack to align the base to 1024 bytes (the swizzle
  // period).
  static constexpr size_t kSmemBytes = kQBufs * kQBytes + 2 * size_t(kStages) * kTileBytes + 1024;
  // The kernel's static shared memory: its mbarriers (q_full, and full and empty of K and
  // of V per stage), 16-byte aligned; the kernel asserts that its declaration fits.
  static constexpr size_t kStaticSmemBytes = (8 * (1 + 4 * size_t(kStages)) + 15) / 16 * 16;
  static_assert(kConsumers >= 1 && kConsumers <= 3, "one to three consumer warpgroups");
  // setmaxnreg only moves registers within what the block got at launch: the launch
  // bounds' per-thread share (a multiple of 8) for every thread. Asking for more leaves
  // the consumers' setmaxnreg.inc waiting for good (a 32-register producer beside two
  // 240-register consumers hung that way: 168 x 384 = 64,512 registers at launch).
  static constexpr int kLaunchRegs = 65536 / kBlocksPerSm / kThreads / 8 * 8;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= kLaunchRegs * kThreads, "the register file");
  // kBlocksPerSm blocks in an SM's 228 KB, each with its dynamic and static shared memory
  // and the 1 KB the hardware reserves for it. (Without the static part this once passed
  // for three stages of the one-consumer tile, which then ran one block an SM:
  // BENCHMARKS.md, "Twenty-fourth session", call 3.)
  static_assert(kBlocksPerSm * (kSmemBytes + kStaticSmemBytes + 1024) <= 228 * 1024, "the shared memory");
};

// The persistent kernel's output stages (Sm90FwdConsumer::stage_output) at D = 128, after
// its K/V rings: 64 rows × D of bf16 a consumer (the grid kernel stages each consumer's O
// in its rows of the Q tile, free by then). At D = 64 its consumers keep their own global
// stores (Sm90FwdConsumer::store): staged, the two-consumer kernel ran 5% slower at
// 16 × 32 × 1K causal (0.238 against 0.227 ms) where D = 128 gained 7-12% at 1K, and the
// three-consumer one spilled 28 bytes (BENCHMARKS.md, "Thirty-fifth session", call 2).
template <class Tile>
constexpr bool persistent_stages_output() { return Tile::kHeadDim == 128; }
template <class Tile>
constexpr size_t persistent_smem_bytes() {
  return Tile::kSmemBytes +
         (persistent_stages_output<Tile>() ? size_t(Tile::kConsumers) * 64 * Tile::kHeadDim * sizeof(bf16) : 0);
}

#if FLASHGPT_HAS_WGMMA
// The epilogue's second half, after Sm90FwdConsumer::stage_output: once every thread of
// consumer cw has written its O rows to the stage (D/64 column blocks of 64 × 64,
// block_stride elements apart), the consumer's first thread (issuer) stores them to rows
// row0.. of (B,T,H,D) by TMA (rows past T are not written) and commits them as one bulk
// group; the stage may be written again once that group has been read
// (sm90::bulk_wait_read). Named barriers kStoreBarrier + cw: 1.. are the consumers' turns.
constexpr int kStoreBarrier = 4;
template <int D>
__device__ __forceinline__ void store_output_tma(const CUtensorMap* o_map, const bf16* stage, int block_stride,
                                                 int cw, bool issuer, int h, int row0, int b) {
  sm90::fence_proxy_async();  // this thread's shared-memory writes, before the TMA reads them
  sm90::named_sync(kStoreBarrier + cw, 128);
  if (issuer) {
#pragma unroll
    for (int c = 0; c < D / kTmaBoxCols; ++c)
      sm90::tma_store_3d(o_map, stage + c * block_stride, h * D + c * kTmaBoxCols, row0, b);
    sm90::bulk_commit();
  }
}

// The K/V rings' barriers, by one thread before the block's first barrier: "full"
// completed by the producer's arrival and the TMA bytes, "empty" by every consumer thread.
template <int S>
__device__ __forceinline__ void init_kv_barriers(uint64_t (&k_full)[S], uint64_t (&k_empty)[S], uint64_t (&v_full)[S],
                                                 uint64_t (&v_empty)[S], uint32_t consumer_threads) {
#pragma unroll
  for (int s = 0; s < S; ++s) {
    sm90::mbar_init(&k_full[s], 1);
    sm90::mbar_init(&v_full[s], 1);
    sm90::mbar_init(&k_empty[s], consumer_threads);
    sm90::mbar_init(&v_empty[s], consumer_threads);
  }
}
#endif

// Whether the consumers of `Tile` under this mask skip the key tiles they see none of
// (tile_choice.h's sm90ws_consumer_key_tiles): blocks of more query rows than a key tile
// holds, under a causal mask (three consumers). Elsewhere every consumer sees every key
// tile of its block.
template <class Tile, bool kCausal>
constexpr bool skips_key_tiles() { return sm90ws_skips_key_tiles(kCausal, Tile::kBlockM, Tile::kBlockN); }

#if FLASHGPT_HAS_WGMMA
// The producer's arrivals on a K or V "empty" barrier for the `skipping` consumers that
// do not read this key tile (128 threads each), once it has issued the tile's load: by
// then the barrier's previous phase has completed (the producer waited for it), so these
// count in this tile's phase.
__device__ __forceinline__ void arrive_for_skipping(uint64_t* empty, int skipping) {
  if (skipping > 0) sm90::mbar_arrive(empty, 128u * uint32_t(skipping));
}
// A consumer's index among the consumers (rows 64·cw.. of the block), from its warpgroup
// wg (1..). With three consumers through sm90::warp_uniform, so that the compiler knows every
// branch on it is warp-uniform: with kSkips a consumer's key-tile count, the trip count of
// its loop around the wgmmas, comes from cw, and computed from threadIdx alone that loop
// ran 4-12% slower than before the skipping (the count alone through a shuffle spilled).
// Measured on an H200 (BENCHMARKS.md, "Thirty-eighth session", calls 1-2; forward TFLOP/s,
// D = 64, two rounds), the warp-uniform index alone (no skipping) took the three-consumer
// kernels from 380-382 to 393 at 8 x 32 x 2K causal, 508-509 to 534-535 at 1 x 32 x 16K
// causal and 511 to 532 at 4 x 32 x 4K full, and cost the two-consumer ones up to 5%
// (4 x 16 x 4K D = 128 causal 587 to 560, 16 x 32 x 1K D = 64 causal 301-305 to 295), which
// keep the plain index.
template <int kConsumers>
__device__ __forceinline__ int consumer_index(int wg) { return (kConsumers == 3 ? sm90::warp_uniform(wg) : wg) - 1; }
#endif

template <class Tile, bool kCausal>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kBlocksPerSm)
    flash_fwd_sm90_ws_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap o_map,
                             const FlashParams p) {
#if FLASHGPT_HAS_WGMMA
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN, S = Tile::kStages;
  static_assert(Tile::kQBufs == 1, "a block per query tile holds one Q tile");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  constexpr int QR = Tile::kQRows, kConsumers = Tile::kConsumers;
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [D/64][QR][64]
  bf16* sK = sQ + QR * D;                    // [S][D/64][BN][64]
  bf16* sV = sK + S * BN * D;                // [S][D/64][BN][64]
  __shared__ alignas(8) uint64_t q_full, k_full[S], k_empty[S], v_full[S], v_empty[S];
  static_assert(sizeof(q_full) + sizeof(k_full) + sizeof(k_empty) + sizeof(v_full) + sizeof(v_empty) <=
                    Tile::kStaticSmemBytes,
                "Tile::kStaticSmemBytes counts these barriers");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp / 4;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  // kSkips: under a causal mask a block taller than its key tiles (three consumers) has
  // consumers that see none of its last key tiles (tile_choice.h); each runs only its own
  // (sm90ws_consumer_key_tiles), the turns pass over it, and the producer arrives on the
  // K/V "empty" barriers in its place. There the sequence's short query tile comes first
  // (sm90ws_lead_shift).
  constexpr bool kSkips = skips_key_tiles<Tile, kCausal>();
  const int m0 = sm90ws_first_row(kSkips, m_block, BM, p.T), m_end = sm90ws_row_end(kSkips, m_block, BM, p.T);
  const int n_end = kCausal ? m_end : p.T;
  const int n_blocks = (n_end + BN - 1) / BN;
  // The consumers with rows in the tile (tile_choice.h): all but in a sequence's short
  // query tile (T = 1024 in 192-row blocks: 64 rows, one consumer). The others leave at
  // once; the K/V rings' "empty" barriers and the turns count only these. Against every
  // consumer running the tile on rows past T (BENCHMARKS.md, "Thirty-seventh session",
  // calls 3 and 4, same-call pairs): 16 x 32 x 1K at D = 64 without a mask 412-413 TFLOP/s
  // against 389, 2K +1.5%, 4K +2%; 16K level without a mask and 0.5-0.7% behind under a
  // causal one.
  const int busy = sm90ws_busy_consumers(kSkips ? m_end : p.T, m0, kConsumers);
  // Without a mask, a tile of one consumer's rows has its key tiles split between the
  // consumers (tile_choice.h's sm90ws_splits_keys; consume_split below). Each K and V tile
  // is still read by one consumer (the barriers' 128 · busy). The producer loads V behind K
  // there (sm90ws_split_v_at): V of key tile nb goes into the ring stage whose previous V,
  // nb − 3, only consumer nb mod 3's step nb releases, and a K queued behind it would reach
  // the next consumer late. (V of nb − 1 after K of nb, as until the sixty-fourth session,
  // ran 0.5-1.5% slower at T = 832-4K: BENCHMARKS.md, "Sixty-fourth session", call 2.)
  constexpr bool kCanSplit = sm90ws_splits_keys(kCausal, kConsumers, 1);
  const bool split = kCanSplit && sm90ws_splits_keys(kCausal, kConsumers, busy);
  // The phase of key tile nb's use of its K/V ring buffer (flipped: the release of the
  // buffer's previous tile, which the producer waits for).
  auto parity = [](int nb) { return uint32_t((nb / S) & 1); };

  if (tid == 0) {
    sm90::mbar_init(&q_full, 1);
    init_kv_barriers(k_full, k_empty, v_full, v_empty, 128 * busy);
    sm90::fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer
    sm90::setmaxnreg_dec<Tile::kProducerRegs>();
    if (tid != 0) return;
    // A tile of `rows` rows from row0 of the column range col0..col0+D into dst
    // ([D/64][rows][64]): boxes of kTmaBoxCols = 64 columns × BN rows.
    auto load = [&](bf16* dst, uint64_t* bar, int rows, int col0, int row0) {
#pragma unroll
      for (int c = 0; c < D / kTmaBoxCols; ++c)
        for (int r = 0; r < rows; r += BN)
          sm90::tma_load_3d(dst + (c * rows + r) * kTmaBoxCols, &qkv_map, bar, col0 + c * kTmaBoxCols, row0 + r, b);
    };
    sm90::mbar_arrive_expect_tx(&q_full, Tile::kQBytes);
    load(sQ, &q_full, QR, h * D, m0);
    auto load_v = [&](int nb, int skipping) {
      const int s = nb % S;
      sm90::mbar_wait(&v_empty[s], parity(nb) ^ 1);
      sm90::mbar_arrive_expect_tx(&v_full[s], Tile::kTileBytes);
      load(sV + s * BN * D, &v_full[s], BN, (2 * p.H + h) * D, nb * BN);
      arrive_for_skipping(&v_empty[s], skipping);
    };
    for (int nb = 0; nb < n_blocks; ++nb) {
      const int s = nb % S;
      const uint32_t released = parity(nb) ^ 1;
      const int skipping = kSkips ? sm90ws_first_consumer_of(nb, BN, m0) : 0;
      sm90::mbar_wait(&k_empty[s], released);
      sm90::mbar_arrive_expect_tx(&k_full[s], Tile::kTileBytes);
      load(sK + s * BN * D, &k_full[s], BN, (p.H + h) * D, nb * BN);
      arrive_for_skipping(&k_empty[s], skipping);
      if (!split) load_v(nb, skipping);
      else if (const int v_at = sm90ws_split_v_at(nb); v_at >= 0) load_v(v_at, 0);
    }
    if (split)
      for (int nb = sm90ws_split_v_tail(n_blocks); nb < n_blocks; ++nb) load_v(nb, 0);
    return;
  }

  // ---- consumers
  sm90::setmaxnreg_inc<Tile::kConsumerRegs>();
  const int cw = consumer_index<kConsumers>(wg);  // rows 64·cw.. of the block
  // The output through this consumer's rows of the Q tile, which its last QKᵀ has read
  // (the other consumers read only theirs); the block's shared memory stays until the
  // TMA has read them.
  auto store_rows = [&](auto& c) {
    bf16* stage = sQ + cw * 64 * kTmaBoxCols;
    const bool issuer = tid % 128 == 0;
    c.stage_output(smem_u32(stage), QR * kTmaBoxCols, b, h);
    store_output_tma<D>(&o_map, stage, QR * kTmaBoxCols, cw, issuer, h, m0 + cw * 64, b);
    if (issuer) sm90::bulk_wait_read<0>();
  };
  if constexpr (kCanSplit) {
    // The split key tiles (above): consumer cw runs the tile's 64 rows over key tiles cw,
    // cw + 3, ..., all of them in ring stage cw, the consumers taking their turns in key
    // tile order (named barrier 1 + key tile mod 3). Consumers 1 and 2 then leave their
    // partial O and row statistics in their stage's K and V buffers, which no later key
    // tile uses, and consumer 0 merges them (Sm90FwdConsumer::add_partial) and stores.
    if (split) {
      static_assert(S == kConsumers, "consumer c's key tiles are those of ring stage c");
      constexpr int kTurnThreads = 256, kMergeBarrier = kStoreBarrier + kConsumers;
      Sm90FwdConsumer<Tile, kCausal, Tile::split_softmax()> c(p, m0, /*rows of consumer*/ 0, warp % 4, lane, sQ);
      const uint32_t k_base = smem_u32(sK + cw * BN * D), v_base = smem_u32(sV + cw * BN * D);
      if (cw == kConsumers - 1) sm90::named_arrive(1, kTurnThreads);
      auto step = [&](int nb, auto is_first) {
        constexpr bool kFirst = decltype(is_first)::value;
        sm90::mbar_wait(&k_full[cw], parity(nb));
        if constexpr (!kFirst) sm90::mbar_wait(&v_full[cw], parity(nb - kConsumers));
        sm90::named_sync(1 + cw, kTurnThreads);
        auto after_qk = [&] {
          if (nb + 1 < n_blocks) sm90::named_arrive(cw + 1 < kConsumers ? cw + 2 : 1, kTurnThreads);
          sm90::mbar_arrive(&k_empty[cw]);
        };
        auto after_pv = [&] { sm90::mbar_arrive(&v_empty[cw]); };
        c.template step_overlapped<kFirst>(nb, k_base, v_base, after_qk, after_pv);
      };
      if (cw < n_blocks) {
        sm90::mbar_wait(&q_full, 0);
        step(cw, std::true_type{});
        int nb = cw + kConsumers;
        for (; nb < n_blocks; nb += kConsumers) step(nb, std::false_type{});
        sm90::mbar_wait(&v_full[cw], parity(nb - kConsumers));
        c.finish_overlapped(v_base);
      }
      auto partial_o = [&](int w) { return reinterpret_cast<float*>(sK + w * BN * D); };
      auto partial_stats = [&](int w) { return reinterpret_cast<float*>(sV + w * BN * D); };
      static_assert(decltype(c)::kPartialO * 128 * sizeof(float) <= Tile::kTileBytes &&
                        decltype(c)::kPartialStats * 128 * sizeof(float) <= Tile::kTileBytes,
                    "a partial O in a K buffer, its row statistics in a V buffer");
      if (cw > 0) {
        if (cw < n_blocks) c.save_partial(partial_o(cw), partial_stats(cw), tid % 128);
        sm90::named_arrive(kMergeBarrier, 128 * kConsumers);
        return;
      }
      sm90::named_sync(kMergeBarrier, 128 * kConsumers);
      for (int w = 1; w < kConsumers && w < n_blocks; ++w) c.add_partial(partial_o(w), partial_stats(w), tid % 128);
      store_rows(c);
      return;
    }
  }
  if (cw >= busy) return;  // every row past T
  // The consumers' work, with kBusy of them taking turns: a compile-time count, so that the
  // full blocks run the loop they ran before (with the count known only at run time the
  // loop took 18 more instructions and 16K without a mask ran 2-3% slower: calls 1-3).
  auto consume = [&](auto busy_consumers) {
    constexpr int kBusy = decltype(busy_consumers)::value;
    Sm90FwdConsumer<Tile, kCausal, Tile::split_softmax()> c(p, m0, cw, warp % 4, lane, sQ);
    const int mine = kSkips ? sm90ws_consumer_key_tiles(m0, cw, BN, n_blocks) : n_blocks;  // this consumer's key tiles
    auto v_base = [&](int nb) { return smem_u32(sV + (nb % S) * BN * D); };
    sm90::mbar_wait(&q_full, 0);
    // Ping-pong: consumer cw issues its matmuls after named barrier 1 + cw and, once its
    // QKᵀ is done, lets the next go (barrier 1 + (cw + 1) mod kBusy: 2 − cw with two; with
    // kSkips the last consumer hands the next key tile's turn to its first consumer).
    // Each barrier counts the 128 threads waiting and the 128 arriving. Consumer 0 starts;
    // the last consumer skips its last hand-over, so every barrier is completed as often
    // as it is waited on. One consumer takes no turns.
    constexpr int kTurnThreads = 256;
    if (kBusy > 1 && cw == kBusy - 1) sm90::named_arrive(1, kTurnThreads);
    const int turn_offset = sm90ws_turn_offset(BN, m0);  // kSkips: key tile nb + 1's first turn
    // Key tile nb; kFirst (nb = 0: no previous P·V) at compile time, see step_overlapped.
    auto step = [&](int nb, auto is_first) {
      constexpr bool kFirst = decltype(is_first)::value;
      const int s = nb % S;
      sm90::mbar_wait(&k_full[s], parity(nb));
      if constexpr (!kFirst) sm90::mbar_wait(&v_full[(nb - 1) % S], parity(nb - 1));
      if constexpr (kBusy > 1) sm90::named_sync(1 + cw, kTurnThreads);
      auto after_qk = [&] {  // S done: the next consumer's turn; K of tile nb read
        if constexpr (kBusy > 1)
          if (cw != kBusy - 1 || nb + 1 < mine) {  // (the last consumer's key tiles are all the block's)
            const int next = cw + 1 < kBusy ? cw + 2 : kSkips ? sm90ws_next_turn(nb, BN, turn_offset) : 1;
            sm90::named_arrive(next, kTurnThreads);
          }
        sm90::mbar_arrive(&k_empty[s]);
      };
      auto after_pv = [&] { sm90::mbar_arrive(&v_empty[(nb - 1) % S]); };  // V of tile nb − 1 read
      c.template step_overlapped<kFirst>(nb, smem_u32(sK + s * BN * D), v_base(kFirst ? 0 : nb - 1), after_qk,
                                         after_pv);
    };
    step(0, std::true_type{});
    for (int nb = 1; nb < mine; ++nb) step(nb, std::false_type{});
    sm90::mbar_wait(&v_full[(mine - 1) % S], parity(mine - 1));
    c.finish_overlapped(v_base(mine - 1));
    sm90::mbar_arrive(&v_empty[(mine - 1) % S]);
    store_rows(c);
  };
  if (busy == kConsumers) {
    consume(std::integral_constant<int, kConsumers>{});
  } else if constexpr (kConsumers == 3) {
    if (busy == 2) consume(std::integral_constant<int, 2>{});
    else consume(std::integral_constant<int, 1>{});
  } else if constexpr (kConsumers == 2) {
    consume(std::integral_constant<int, 1>{});
  }
#else
  static_assert(Tile::kMTiles == 1 && Tile::kNTiles > 0 && Tile::kDTiles > 0 && Tile::kQBufs > 0, "tile shape");
  __trap();  // never launched: the dispatcher checks that sm_90a code was built
#endif
}

// The persistent schedule of the two- and three-consumer tiles (auto's where tile_choice.h's
// sm90ws_forward_persistent says: short sequences): one block an SM walks the query
// tiles in the grid's order ((batch, head) major, each head's last query tiles first), so
// that the tiles in flight share their heads' K and V in the L2, in rounds of gridDim.x
// taken forwards and backwards in turn (tile_of). What a block per tile pays in the open at every tile runs here
// under the previous tile: the producer carries the K/V rings across tiles (a ring
// position counted over the block's tiles), and each consumer has its own 64 rows of Q
// (a tensor map with 64-row boxes), reloaded as soon as that consumer has issued its last
// QKᵀ of the tile (q_empty), under its last softmax, P·V and epilogue; at D = 128 in two
// buffers taken in turn (Tile::kQBufs), so that a tile's Q is loaded with its first K/V
// tiles, while the tile before still runs. The consumers' turns run on across tiles: one
// that has finished a tile starts the next one's first QKᵀ while the other is in its
// epilogue. At D = 64 a consumer issues a tile's last P·V together with the next tile's
// first QKᵀ, in one turn, and stores the finished tile's output while that QKᵀ runs
// (Sm90FwdConsumer::step_across, kAcross). Unlike the grid kernel's, every consumer runs
// every query tile (with kSkips up to its own last key tile, as there), on rows past T too,
// and with kSkips on rows past a sequence's short first tile (T = 2048: 128 rows, so the
// third consumer runs rows 128-191 of the next tile again, and does not store them; it
// needs one key tile): a branch around the matmuls
// for a consumer without rows spilled 4 bytes at three consumers and, in a version that
// had it at two as well, cost GPT-2's shape 7% (BENCHMARKS.md, "Thirty-seventh session",
// call 1). cuDNN's forward on Hopper is persistent too (132 blocks of 384 threads at these
// shapes: BENCHMARKS.md, "Twenty-fifth session", call 2).
// Same arithmetic as the grid kernel, tile by tile: the same bits.
template <class Tile, bool kCausal>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    flash_fwd_sm90_ws_persistent_kernel(const __grid_constant__ CUtensorMap kv_map,
                                        const __grid_constant__ CUtensorMap q_map,
                                        const __grid_constant__ CUtensorMap o_map, const FlashParams p,
                                        const __grid_constant__ ForwardTail tail) {
#if FLASHGPT_HAS_WGMMA
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN, S = Tile::kStages;
  constexpr int QR = Tile::kQRows, kConsumers = Tile::kConsumers;
  static_assert(kConsumers >= 2 && Tile::kBlocksPerSm == 1, "the persistent schedule takes turns between consumers");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  constexpr int QB = Tile::kQBufs;
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [QB][D/64][QR][64], consumer w's rows 64w..
  bf16* sK = sQ + QB * QR * D;               // [S][D/64][BN][64]
  bf16* sV = sK + S * BN * D;                // [S][D/64][BN][64]
  bf16* sO = sV + S * BN * D;                // [kConsumers][D/64][64][64]: the output stages, if any
  __shared__ alignas(8) uint64_t q_full[QB][kConsumers], q_empty[QB][kConsumers], k_full[S], k_empty[S], v_full[S],
      v_empty[S];
  // Claimed tiles (below): the index of the tile after the one whose Q is in buffer qb
  // (-1: none), for consumer w, written by the producer before that Q's q_full arrival and
  // read by the consumer after its wait.
  __shared__ int tile_after[QB][kConsumers];
  static_assert(persistent_smem_bytes<Tile>() + sizeof(q_full) * 2 + sizeof(k_full) * 4 + 1024 <= 228 * 1024,
                "the shared memory");
  constexpr int kConsumerThreads = 128 * kConsumers;
  constexpr uint32_t kQPartBytes = 64u * D * sizeof(bf16);
  constexpr bool kSkips = skips_key_tiles<Tile, kCausal>();  // as in the grid kernel
  // A tile's last P·V issued with the next tile's first QKᵀ (Sm90FwdConsumer::step_across),
  // where the epilogue is the consumers' own global stores (D = 64): 1.5-2.4% faster at 1K
  // causal, 4.7% at 512. With D = 128's staged epilogue (shared memory, a TMA store) under
  // the QKᵀ the forward ran 0-3% slower (BENCHMARKS.md, "Thirty-ninth session", calls 2-3).
  constexpr bool kAcross = !persistent_stages_output<Tile>();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp / 4;
  const int m_blocks = (p.T + BM - 1) / BM, tiles = m_blocks * p.H * p.B;
  // The block's local-th tile, or -1 past its last: round `local` of gridDim.x tiles,
  // taken in turn forwards and backwards, so that under a causal mask (each head's tiles
  // heaviest first) a block that takes a long tile in one round takes a short one in the
  // next; after tail.rounds rounds, the block's list (tile_choice.h's
  // persistent_forward_schedule).
  auto tile_of = [&](int local) { return persistent_forward_tile(tail, local, int(blockIdx.x), int(gridDim.x), tiles); };
  // Or, in the three-consumer kernel with p.fwd_head_group > 0, claimed: the block's first
  // tile is the blockIdx.x-th of the claim order (tile_choice.h's grouped_tile), each
  // later one the next from a counter, claimed by the producer when it starts the tile
  // before. Every block claims until it draws past the last tile, so the claims number
  // `tiles` in all and the last one resets the counter. The producer hands each claim's
  // index to the consumers (tile_after) and each side works out the tile (tile_at); with
  // the tile itself handed on, the producer's 24 registers spilled. Only three consumers:
  // the same change in the two-consumer kernels made them 5-11% slower under a causal
  // mask even in rounds, with the same arithmetic (BENCHMARKS.md, "Fortieth session"): with
  // the tile index read from shared memory their wgmma descriptors left the uniform
  // registers (an R2UR pair before each P·V wgmma; "Forty-first session"). An order made on
  // the host and passed with the launch kept their code, but measured no faster there.
  constexpr bool kClaims = sm90ws_claims_tiles(kConsumers);
  const bool claimed = kClaims && p.fwd_head_group > 0;
  auto tile_at = [&](int k) { return k < 0 || !claimed ? k : grouped_tile(k, p.B * p.H, m_blocks, p.fwd_head_group); };
  struct Coords { int m_block, h, b, n_blocks; };
  // A tile's first row and its end: with kSkips the short tile first, as in the grid kernel.
  // (first_row as one call of sm90ws_first_row moved instructions in the two-consumer causal
  // kernel's PTX; so the branch at compile time.)
  auto first_row = [&](int m_block) {
    if constexpr (kSkips) return sm90ws_first_row(true, m_block, BM, p.T);
    return m_block * BM;
  };
  auto row_end = [&](int m_block) { return sm90ws_row_end(kSkips, m_block, BM, p.T); };
  auto coords = [&](int t) {
    const int bh = t / m_blocks, m_block = m_blocks - 1 - (t - bh * m_blocks);
    const int n_end = kCausal ? row_end(m_block) : p.T;
    return Coords{m_block, bh % p.H, bh / p.H, (n_end + BN - 1) / BN};
  };

  if (tid == 0) {
#pragma unroll
    for (int w = 0; w < kConsumers; ++w)
#pragma unroll
      for (int j = 0; j < QB; ++j) {
        sm90::mbar_init(&q_full[j][w], 1);
        sm90::mbar_init(&q_empty[j][w], 128);
      }
    init_kv_barriers(k_full, k_empty, v_full, v_empty, kConsumerThreads);
    sm90::fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer
    sm90::setmaxnreg_dec<Tile::kProducerRegs>();
    if (tid != 0) return;
    auto load_kv = [&](bf16* dst, uint64_t* bar, int col0, int row0, int b) {
#pragma unroll
      for (int c = 0; c < D / kTmaBoxCols; ++c)
        sm90::tma_load_3d(dst + c * BN * kTmaBoxCols, &kv_map, bar, col0 + c * kTmaBoxCols, row0, b);
    };
    auto claim = [&] {
      const int v = atomicAdd(p.fwd_tile_counter, 1), k = int(gridDim.x) + v;
      if (v == tiles - 1) *p.fwd_tile_counter = 0;  // the launch's last claim
      return k < tiles ? k : -1;
    };
    int kv = 0;
    // A claimed tile's index is read back from tile_after after the tile's loads: held in
    // a register across them, it spilled the 24.
    for (int local = 0, k = claimed ? int(blockIdx.x) : tile_of(0); k >= 0;
         k = claimed ? tile_after[local % QB][0] : tile_of(local + 1), ++local) {
      const Coords cd = coords(tile_at(k));
      for (int nb = 0; nb < cd.n_blocks; ++nb, ++kv) {
        const int s = kv % S;
        const uint32_t parity = ((kv / S) & 1) ^ 1;  // the release of this buffer's previous tile
        const int skipping = kSkips ? sm90ws_first_consumer_of(nb, BN, first_row(cd.m_block)) : 0;
        sm90::mbar_wait(&k_empty[s], parity);
        sm90::mbar_arrive_expect_tx(&k_full[s], Tile::kTileBytes);
        load_kv(sK + s * BN * D, &k_full[s], (p.H + cd.h) * D, nb * BN, cd.b);
        arrive_for_skipping(&k_empty[s], skipping);
        if (nb == 0) {  // this tile's Q, each consumer's rows once it is done with the buffer's last tile
          const int k_next = claimed ? claim() : -1;
          const int qb = local % QB;
          bf16* q_dst = sQ + qb * QR * D;
#pragma unroll
          for (int w = 0; w < kConsumers; ++w) {
            if (local >= QB) sm90::mbar_wait(&q_empty[qb][w], uint32_t(local / QB - 1) & 1);
            if (claimed) tile_after[qb][w] = k_next;
            sm90::mbar_arrive_expect_tx(&q_full[qb][w], kQPartBytes);
#pragma unroll
            for (int c = 0; c < D / kTmaBoxCols; ++c)
              sm90::tma_load_3d(q_dst + (c * QR + w * 64) * kTmaBoxCols, &q_map, &q_full[qb][w],
                                cd.h * D + c * kTmaBoxCols, first_row(cd.m_block) + w * 64, cd.b);
          }
        }
        sm90::mbar_wait(&v_empty[s], parity);
        sm90::mbar_arrive_expect_tx(&v_full[s], Tile::kTileBytes);
        load_kv(sV + s * BN * D, &v_full[s], (2 * p.H + cd.h) * D, nb * BN, cd.b);
        arrive_for_skipping(&v_empty[s], skipping);
      }
    }
    return;
  }

  // ---- consumers
  sm90::setmaxnreg_inc<Tile::kConsumerRegs>();
  const int cw = consumer_index<kConsumers>(wg);  // rows 64·cw.. of each query tile
  auto v_base = [&](int kv) { return smem_u32(sV + (kv % S) * BN * D); };
  auto parity = [](int kv) { return uint32_t((kv / S) & 1); };
  // Turns as in the grid kernel, run on across the block's tiles (every consumer takes
  // as many steps a tile); the last consumer skips only its very last hand-over.
  constexpr int kTurnThreads = 256;
  if (cw == kConsumers - 1) sm90::named_arrive(1, kTurnThreads);
  // This tile's state (kv0: the ring position of its first K/V tile; mine: this consumer's
  // key tiles), set by next_tile; claimed, last_tile and t_after (the next tile's index)
  // by wait_q.
  int local = -1, t = -1, kv0 = 0, n_blocks = 0, m0 = 0, mine = 0, turn_offset = 0, qb = 0, t_after = -1;
  bool last_tile = false;
  auto next_tile = [&] {
    kv0 += n_blocks;
    t = claimed ? tile_at(++local == 0 ? int(blockIdx.x) : t_after) : tile_of(++local);
    if (t < 0) return false;
    if (!claimed) last_tile = tile_of(local + 1) < 0;
    const Coords cd = coords(t);
    n_blocks = cd.n_blocks, m0 = first_row(cd.m_block);
    mine = kSkips ? sm90ws_consumer_key_tiles(m0, cw, BN, n_blocks) : n_blocks;
    turn_offset = sm90ws_turn_offset(BN, m0);  // kSkips: key tile nb + 1's first turn
    qb = local % QB;
    return true;
  };
  // Once key tile nb's S is done: the next consumer's turn, and K (and, after this
  // consumer's last, Q) released.
  auto hand_off = [&](int nb) {
    if (cw != kConsumers - 1 || nb + 1 < n_blocks || !last_tile)
      sm90::named_arrive(cw + 1 < kConsumers          ? cw + 2
                         : kSkips && nb + 1 < n_blocks ? sm90ws_next_turn(nb, BN, turn_offset)
                                                       : 1,
                         kTurnThreads);
  };
  auto release_k = [&](int nb, int s) {
    sm90::mbar_arrive(&k_empty[s]);
    if (nb + 1 == mine) sm90::mbar_arrive(&q_empty[qb][cw]);
  };
  auto wait_turn = [&](int nb) {
    const int kv = kv0 + nb;
    sm90::mbar_wait(&k_full[kv % S], parity(kv));
    if (nb > 0) sm90::mbar_wait(&v_full[(kv - 1) % S], parity(kv - 1));
    sm90::named_sync(1 + cw, kTurnThreads);
  };
  auto wait_q = [&] {
    sm90::mbar_wait(&q_full[qb][cw], uint32_t(local / QB) & 1);
    if (claimed) t_after = tile_after[qb][cw], last_tile = t_after < 0;
  };
  if (!next_tile()) return;
  Sm90FwdConsumer<Tile, kCausal, Tile::split_softmax()> c(p, m0, cw, warp % 4, lane, sQ + qb * QR * D);
  auto step = [&](int nb, auto is_first) {
    constexpr bool kFirst = decltype(is_first)::value;
    const int kv = kv0 + nb, s = kv % S;
    wait_turn(nb);
    auto after_qk = [&] { hand_off(nb); release_k(nb, s); };
    auto after_pv = [&] { sm90::mbar_arrive(&v_empty[(kv - 1) % S]); };  // V of the previous key tile read
    c.template step_overlapped<kFirst>(nb, smem_u32(sK + s * BN * D), v_base(kFirst ? kv : kv - 1), after_qk,
                                       after_pv);
  };
  auto epilogue = [&](const Coords& cd) {
    // A short first tile's consumers past its rows ran rows of the next tile: no store.
    if constexpr (kSkips)
      if (first_row(cd.m_block) + 64 * cw >= row_end(cd.m_block)) return;
    if constexpr (persistent_stages_output<Tile>()) {
      // The output through the consumer's stage, once the TMA has read its previous tile's.
      bf16* stage = sO + cw * 64 * D;
      const bool issuer = tid % 128 == 0;
      if (issuer) sm90::bulk_wait_read<0>();
      sm90::named_sync(kStoreBarrier + cw, 128);
      c.stage_output(smem_u32(stage), 64 * kTmaBoxCols, cd.b, cd.h);
      store_output_tma<D>(&o_map, stage, 64 * kTmaBoxCols, cw, issuer, cd.h, first_row(cd.m_block) + cw * 64, cd.b);
    } else {
      c.store(cd.b, cd.h);
    }
  };
  wait_q();
  step(0, std::true_type{});
  for (;;) {
    for (int nb = 1; nb < mine; ++nb) step(nb, std::false_type{});
    const int last = kv0 + mine - 1;
    const Coords done = coords(t);
    sm90::mbar_wait(&v_full[last % S], parity(last));
    if (!next_tile()) {
      c.finish_overlapped(v_base(last));
      sm90::mbar_arrive(&v_empty[last % S]);
      epilogue(done);
      break;
    }
    if constexpr (kAcross) {
      // The finished tile's last P·V with the next tile's first QKᵀ, its epilogue under the
      // QKᵀ (Sm90FwdConsumer::step_across).
      wait_q();
      wait_turn(0);
      const int s = kv0 % S;
      c.step_across(
          v_base(last), m0, sQ + qb * QR * D, smem_u32(sK + s * BN * D),
          [&] { sm90::mbar_arrive(&v_empty[last % S]); hand_off(0); }, [&] { epilogue(done); },
          [&] { release_k(0, s); });
    } else {
      c.finish_overlapped(v_base(last));
      sm90::mbar_arrive(&v_empty[last % S]);
      epilogue(done);
      c.begin_tile(m0, sQ + qb * QR * D);
      wait_q();
      step(0, std::true_type{});
    }
  }
  // The shared memory stays until the TMA has read the last stage.
  if (persistent_stages_output<Tile>() && tid % 128 == 0) sm90::bulk_wait_read<0>();
#else
  static_assert(Tile::kMTiles == 1 && Tile::kNTiles > 0 && Tile::kDTiles > 0 && Tile::kQBufs > 0, "tile shape");
  __trap();  // never launched: the dispatcher checks that sm_90a code was built
#endif
}

// A block per query tile.
template <class Tile, bool kCausal>
void launch_grid(const FlashParams& p, cudaStream_t stream) {
  auto kernel = flash_fwd_sm90_ws_kernel<Tile, kCausal>;
  static const bool opted_in = opt_in_dynamic_smem(kernel, Tile::kSmemBytes);  // once
  (void)opted_in;
  const CUtensorMap map = bf16_rows_tensor_map(p.qkv, p.qkv_row_stride, p.T, p.B, Tile::kBlockN, "qkv");
  const CUtensorMap o_map = bf16_rows_tensor_map(p.out, p.o_row_stride, p.T, p.B, 64, "out");
  const dim3 grid((p.T + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(map, o_map, p);
  CUDA_CHECK_LAUNCH();
}

// The persistent kernel on the schedule of tile_choice.h's persistent_forward_schedule: at
// most persistent_blocks blocks, or with `exact_blocks` that many (a test knob), in rounds
// and perhaps a list after them (FLASHGPT_ATTENTION_FWD_TAIL).
template <class Tile, bool kCausal>
void launch_persistent(const FlashParams& p, int persistent_blocks, bool exact_blocks, cudaStream_t stream) {
  // (The launcher has checked the knob on this call already, whichever kernel runs.)
  const bool list = forward_tail_list(std::getenv("FLASHGPT_ATTENTION_FWD_TAIL")) && p.fwd_head_group == 0;
  auto pk = flash_fwd_sm90_ws_persistent_kernel<Tile, kCausal>;
  static const bool pk_opted_in = opt_in_dynamic_smem(pk, persistent_smem_bytes<Tile>());  // once
  (void)pk_opted_in;
  const CUtensorMap map = bf16_rows_tensor_map(p.qkv, p.qkv_row_stride, p.T, p.B, Tile::kBlockN, "qkv");
  const CUtensorMap q_map = bf16_rows_tensor_map(p.qkv, p.qkv_row_stride, p.T, p.B, 64, "qkv");
  const CUtensorMap o_map = bf16_rows_tensor_map(p.out, p.o_row_stride, p.T, p.B, 64, "out");
  const int64_t heads = int64_t(p.B) * p.H, tiles = (p.T + Tile::kBlockM - 1) / Tile::kBlockM * heads;
  // The schedule, kept for the last shape asked (the model takes O(tiles) a try). Claimed
  // tiles balance themselves: every block the caller allows, no list.
  const bool exact = exact_blocks || p.fwd_head_group > 0;
  using Key = std::tuple<int, int64_t, int, bool, bool>;  // T, heads, max blocks, exact, list
  const Key key{p.T, heads, persistent_blocks, exact, list};
  static thread_local Key last_key{-1, 0, 0, false, false};
  static thread_local PersistentSchedule last{};
  if (key != last_key) {
    last = persistent_forward_schedule(persistent_blocks, heads, p.T, Tile::kBlockM, Tile::kBlockN, kCausal, exact, list);
    last_key = key;
  }
  FG_ASSERT(last.blocks <= tiles, "the persistent forward's schedule has more blocks than tiles");
  pk<<<unsigned(last.blocks), Tile::kThreads, persistent_smem_bytes<Tile>(), stream>>>(map, q_map, o_map, p, last.tail);
  CUDA_CHECK_LAUNCH();
}

// A tile as a block per query tile (Grid), or with persistent_blocks > 0 persistent
// (Persistent: the same tile with the persistent kernel's buffers; only the tiles of
// tile_choice.h's sm90ws_has_persistent_kernel, and the caller asks for no other).
template <class Grid, class Persistent, bool kCausal>
void launch_tile(const FlashParams& p, int persistent_blocks, bool exact_blocks, cudaStream_t stream) {
  static_assert(Grid::kConsumers == Persistent::kConsumers && Grid::kBlockN == Persistent::kBlockN, "one tile shape");
  if constexpr (sm90ws_has_persistent_kernel(Persistent::kConsumers, Persistent::kBlockN)) {
    if (persistent_blocks > 0) return launch_persistent<Persistent, kCausal>(p, persistent_blocks, exact_blocks, stream);
  } else {
    FG_ASSERT(persistent_blocks == 0, "the sm90ws forward has no persistent kernel for ", Grid::kConsumers,
              " consumers with ", Grid::kBlockN, "-key tiles");
  }
  launch_grid<Grid, kCausal>(p, stream);
}

}  // namespace

template <int kHeadDim, bool kCausal>
void launch_fwd_sm90_ws(const FlashParams& p, int tile, int persistent_blocks, bool exact_blocks, cudaStream_t stream) {
  // The key tiles of tile_choice.h's sm90ws_block_n: one consumer 128 at D = 64 and 64 at
  // D = 128 (two blocks' shared memory), tile 1 at D = 128 176, else 128.
  if (tile == kSm90WsOneConsumer) {
    using One = Sm90WsTile<kHeadDim, sm90ws_block_n(kSm90WsOneConsumer, kHeadDim), /*kConsumers=*/1>;
    return launch_tile<One, One, kCausal>(p, persistent_blocks, exact_blocks, stream);
  }
  if (tile == 1) {
    using Second = Sm90WsTile<kHeadDim, sm90ws_block_n(1, kHeadDim), sm90ws_consumers(1, kHeadDim)>;
    return launch_tile<Second, Second, kCausal>(p, persistent_blocks, exact_blocks, stream);
  }
  // Tile 0 persistent: two Q buffers at D = 128 (Sm90WsTile::kQBufs).
  using Persistent0 = Sm90WsTile<kHeadDim, 128, 2, /*kQBufs=*/kHeadDim == 128 ? 2 : 1>;
  launch_tile<Sm90WsTile<kHeadDim>, Persistent0, kCausal>(p, persistent_blocks, exact_blocks, stream);
}

template void launch_fwd_sm90_ws<64, /*kCausal=*/true>(const FlashParams&, int, int, bool, cudaStream_t);
template void launch_fwd_sm90_ws<64, /*kCausal=*/false>(const FlashParams&, int, int, bool, cudaStream_t);
template void launch_fwd_sm90_ws<128, /*kCausal=*/true>(const FlashParams&, int, int, bool, cudaStream_t);
template void launch_fwd_sm90_ws<128, /*kCausal=*/false>(const FlashParams&, int, int, bool, cudaStream_t);

}  // namespace flashgpt::cuda::attn
