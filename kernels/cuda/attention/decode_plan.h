// How FlashDecoding (flash_decode.cu) splits each (b, h)'s cache among thread blocks.
// Host-only, so the CPU tests check the rule (tests/test_decode_plan.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include "src/errors.h"

namespace flashgpt::cuda {

struct DecodePlan {
  int64_t chunk;         // keys per block
  int splits;            // blocks per (b, h)
  bool cluster = false;  // the splits of a (b, h) are one thread-block cluster, merged in it
};

// The most splits of a (b, h) that one thread-block cluster may hold (the portable cluster
// size) for the tensor-core kernel's merge in distributed shared memory.
constexpr int kDecodeMaxClusterSplits = 8;
// The longest chunk (keys) to which plan_decode lowers its chunks for a cluster merge.
constexpr int64_t kDecodeClusterChunk = 8192;

// Splits per (b, h) the plan considers (the longest chunks win anyway).
constexpr int64_t kDecodeMaxSplits = 4096;
// What a split plan pays for its merge when B·H blocks already cover the SMs (in tiles;
// see plan_decode).
constexpr int64_t kDecodeMergeTiles = 24;
// The same for a plan merged in a thread-block cluster (see plan_decode).
constexpr int64_t kDecodeClusterMergeTiles = 4;

// Keys per block and the number of splits for B·H caches of T keys, read in tiles of
// `tile` keys, at most max_chunk keys a block, `resident` blocks at a time on a GPU of
// `sms` SMs. want_splits > 0 forces about that many splits (tests, tuning). Otherwise
// the cheapest split count under a simple model: blocks run in waves of `resident`, a
// wave lasts as long as its chunk plus a start-up of about two tiles, chunks are whole
// tiles; ties go to fewer splits (less to combine). When one block per (b, h) already
// gives every SM work (B·H >= sms), the GPU reads at full bandwidth either way and a split
// only evens out the load, while the merge at the end (the acq_rel count, the partials read
// back from L2: a few serial memory latencies) is not in the model: a split plan then
// also pays kDecodeMergeTiles tiles. Measured on an H200 at B = 16, H = 12, D = 64
// (BENCHMARKS.md, "Ninth session"): one split against two took 0.0172 against 0.0198 ms
// with 1K keys and 0.0292 against 0.0307 with 2K; with 4K two splits were 1-3% ahead and
// from 8K on 6% (0.0967 against 0.1030). Any price between 16 and 32 tiles gives those
// choices; 24. The bulk kernel's tiles grew from 8 to 16 KB in the twenty-third session;
// the same 24 (and two-tile start-up) gave the split counts measured with them there.
//
// max_cluster > 0: the kernel can merge up to that many splits inside a thread-block
// cluster, where each block stores its partial into the first block's shared memory,
// counted on a barrier there (st.async), instead of the count and the partials' round trips
// through L2 (flash_decode.cu, merge_in_cluster). A plan of 2 to max_cluster splits whose
// blocks all fit in one wave is a cluster; and where max_cluster splits of every (b, h)
// fit in one wave and cover T in chunks of at most kDecodeClusterChunk keys, the plan
// takes no more splits than max_cluster. Measured on an H100, 12 layers back to back
// (BENCHMARKS.md, "Sixty-sixth session"): at B = 1, H = 12, D = 64, 16K keys the merge
// through L2 cost 1.7 us a call (a kernel that skipped it took 20.5 against 22.2 us) and 8
// splits read as fast as the model's 32 (22.0 against 22.2 us, call 2); with the cluster
// merge 8 splits were 2-9% faster than the model's 8-32 through L2 from 1K to 32K keys,
// level at 64K and 0.5% slower at 128K (chunks of 16K keys), and at B = 16 0.4-0.6% faster
// with 2 splits (8K, 16K keys) but 3.5% slower with 4 (64K: 768 blocks, two waves; call 3).
// A cluster merge is no round trip through L2, so a cluster plan pays kDecodeClusterMergeTiles
// instead of kDecodeMergeTiles: on two H100s at B = 16, H = 12, D = 64 two splits in
// clusters were 1.0-1.6% faster than one with 2K keys and 2.7-3.0% with 4K, and with 1K
// level in one round and 1.2% faster in the other (BENCHMARKS.md, "Sixty-ninth session",
// calls 2 and 3), where the price of 24 tiles had kept one split up to 4K keys. Any price
// from 4 to 7 tiles gives two splits at 2K and 4K and keeps one at 1K (a tie at 4, which
// goes to fewer splits); 4.
inline DecodePlan plan_decode(int64_t B, int64_t H, int64_t T, int64_t tile, int64_t max_chunk, int64_t resident,
                              int64_t sms, int want_splits, int max_cluster = 0) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  resident = std::max<int64_t>(1, resident);
  auto in_cluster = [&](int64_t splits) { return splits > 1 && splits <= max_cluster && B * H * splits <= resident; };
  if (want_splits > 0) {
    const int64_t chunk = std::max<int64_t>(1, ceil_div(T, want_splits));
    const int64_t splits = ceil_div(T, chunk);
    return {chunk, int(splits), in_cluster(splits)};
  }
  // Every whole-tile chunk up to max_chunk (at most max_chunk / tile of them: cheap
  // enough for every decode step), longest first, so that ties keep fewer splits; no more
  // than kDecodeMaxSplits splits unless even max_chunk needs more.
  int64_t best_chunk = 0, best_cost = INT64_MAX;
  const int64_t longest = std::min(ceil_div(T, tile) * tile, max_chunk / tile * tile);
  const bool capped = max_cluster > 0 && B * H * max_cluster <= resident && T <= max_cluster * kDecodeClusterChunk &&
                      ceil_div(T, longest) <= max_cluster;  // one cluster of short chunks covers T
  for (int64_t chunk = longest; chunk >= tile; chunk -= tile) {
    const int64_t splits = ceil_div(T, chunk);
    if (splits > kDecodeMaxSplits && best_chunk) break;  // shorter chunks only add splits
    if (capped && splits > max_cluster) break;
    const int64_t price = in_cluster(splits) ? kDecodeClusterMergeTiles : kDecodeMergeTiles;
    const int64_t merge = splits > 1 && B * H >= sms ? price * tile : 0;
    const int64_t cost = ceil_div(B * H * splits, resident) * (chunk + 2 * tile) + merge;
    if (cost < best_cost) best_cost = cost, best_chunk = chunk;
  }
  const int64_t splits = ceil_div(T, best_chunk);
  return {best_chunk, int(splits), in_cluster(splits)};
}

// Chunks of at most this many tiles where the cache streams for many waves (decode_max_chunk).
constexpr int64_t kDecodeStreamChunkTiles = 8;
// ... once the blocks at that length number at least this many waves of resident blocks.
constexpr int64_t kDecodeStreamWaves = 8;
// ... or T / this many keys where that is longer (decode_max_chunk).
constexpr int64_t kDecodeStreamMaxSplits = 128;

// The longest chunk (keys) the plan may give a block of the kernel whose own limit is
// max_chunk, with tiles of `tile` keys and `resident` blocks at a time on the GPU: 8 tiles
// (128 KB of K and as much V with 16 KB tiles) where chunks that short still make at least
// 8 waves of resident blocks (but never shorter than T / 128 keys, whole tiles), else
// max_chunk. There the GPU reads at full bandwidth whatever the split, and the wave
// model's long chunks (2-35 splits) lose to short ones: the last chunks still streaming
// while SMs idle cost about a chunk, and the merge of many more partials (a few hundred
// bytes each, through L2) much less. Measured on an H100 (BENCHMARKS.md, "Seventy-fifth
// session", calls 3 and 4, two rounds each within 0.3%, 12 layers back to back, splits
// forced): at B = 16, H = 12, D = 64 (tiles of 128 keys) chunks of 1024 keys were 1.5%, 3.0%, 2.8%
// and 1.8% faster than the model's 2, 4, 8 and 35 splits at 32K, 64K, 128K and 256K keys
// (1.8-3.9% for the best chunk, 256-1024 keys), at 16K and 8K keys (3072 and 1536 blocks
// against 396 resident) 0.8% faster and level, and at 4K chunks of 512 keys 1.3% slower; at
// B = 16, H = 16, D = 128 (tiles of 64 keys, 264 resident) chunks of 512 keys 0.9%, 1.7%,
// 1.0%, 1.2% and 0.1% faster from 8K to 128K keys and 0.3% slower at 256K (against the
// model's 2048); at B = 1, H = 16 2.3% and 0.8% faster at 256K and 128K keys, level at 64K
// and 1.0% slower at 32K (1024 blocks). Chunks of half a tile (D = 64) took 1.7 times as
// long, of one tile at D = 128 1.4 times. On a second H100 (same session, call 6, two
// rounds) more than 128 splits of 256 pairs at D = 128 were 0.5-4.3% slower (256 and 512
// splits at 64K-256K keys), where 64 or 128 were level with the model or 0.3% faster;
// hence the floor of T / 128 keys. The tensor-core and bulk kernels
// only: the register kernel keeps its own limit.
inline int64_t decode_max_chunk(int64_t B, int64_t H, int64_t T, int64_t tile, int64_t resident, int64_t max_chunk) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t chunk = kDecodeStreamChunkTiles * tile;
  const bool streams = B * H * ceil_div(T, chunk) >= kDecodeStreamWaves * std::max<int64_t>(1, resident);
  const int64_t fewest = ceil_div(ceil_div(T, kDecodeStreamMaxSplits), tile) * tile;  // T / 128, whole tiles
  return streams ? std::min(max_chunk, std::max(chunk, fewest)) : max_chunk;
}

// The bulk kernel's tile (flash_decode.cu), in KB of K: 16 (and as much V) in two stages,
// the default, or 32 in one; 64 KB in flight a block either way. `requested` is
// FLASHGPT_DECODE_TILE_KB (16 or 32; null or empty: 16; anything else is an InputError).
// Measured on an H200 at the 36 suite shapes (BENCHMARKS.md, "Thirtieth session", calls 1
// and 2, ms, 32 KB against 16 KB in the same run): at batch 16 32 KB was faster with 4K
// keys at D = 64 (H = 12; 2-4%) and with 128K at D = 128 (H = 16; 1-1.4%), slower with 1K
// keys (1-3.5% at D = 64) and with 256K at D = 64 (1.5-1.8%), level elsewhere within
// 0.8%; at batch 1 2-10% slower at D = 64 up to 16K keys. No shape under the best SDPA
// backend with 16 KB came above it with 32 KB but the one at D = 64, 4K, so the default
// stays 16 KB and 32 KB is there to tune a shape.
inline int decode_bulk_tile_kb(const char* requested) {
  const std::string v = requested && *requested ? requested : "16";
  if (v != "16" && v != "32") fail_input("FLASHGPT_DECODE_TILE_KB must be 16 or 32, got '", v, "'");
  return v == "32" ? 32 : 16;
}

// A decode switch that is on unless asked off: `requested` (the value of the environment
// variable `name`) is 1 (the default: null or empty) or 0; anything else is an InputError.
inline bool decode_switch(const char* name, const char* requested) {
  const std::string v = requested && *requested ? requested : "1";
  if (v != "0" && v != "1") fail_input(name, " must be 0 or 1, got '", v, "'");
  return v == "1";
}

// Whether the tensor-core decode kernel merges up to kDecodeMaxClusterSplits splits in a
// thread-block cluster (plan_decode's max_cluster): FLASHGPT_DECODE_CLUSTER, 0 for the
// merge through L2 at every split count, to compare.
inline bool decode_cluster_merge(const char* requested) {
  return decode_switch("FLASHGPT_DECODE_CLUSTER", requested);
}

// Whether the Hopper decode kernels are launched with programmatic dependent launch
// (flash_decode.cu): FLASHGPT_DECODE_PDL, 0 for plain launches, to compare.
inline bool decode_overlap(const char* requested) { return decode_switch("FLASHGPT_DECODE_PDL", requested); }

}  // namespace flashgpt::cuda
