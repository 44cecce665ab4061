// How the sm90 attention backward adds up dQ (FLASHGPT_ATTENTION_BWD_DQ) and in which
// order it takes its items (FLASHGPT_ATTENTION_BWD_HEAD_GROUP). Host-only, so the CPU
// tests check the rules (tests/test_dq_mode.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include "src/errors.h"

namespace flashgpt::cuda::attn {

// atomic: per-thread fp32 atomics into a zeroed accumulator; tma: each query tile's
// partial staged in shared memory and added by the TMA unit (cp.reduce.async.bulk.tensor);
// owner: whole (batch, head) units per block, the first contribution stored and the
// middle ones added through the same TMA tile, the last added to the partial and written
// in bf16 by the kernel (no zeroed accumulator, no postprocess); flat: as tma, with the
// tile and the accumulator in the order of the dQ registers (dq_tile.h's flat tile): one
// bulk reduce-add a tile, and the postprocess puts the rows in place.
enum class DqMode { atomic, tma, owner, flat };

// The mode for `requested` (the variable's value: auto, atomic, tma, owner or flat; null
// or empty = auto; anything else is an InputError). auto: flat, at both head dims and
// with or without a mask. Measured on an H200 (BENCHMARKS.md, interleaved runs):
// - flat against tma: at D = 128 without a mask, once dK and dV were staged in both, level
//   to 1.2% ahead from 1K to 16K ("Thirty-sixth session", call 4); at D = 64 1.4% ahead on
//   average over the sweep's shapes (-2% to +3.6%) and 0.7-1.5% at T = 65,536
//   ("Thirty-second session").
// - tma against atomic: ahead at every shape measured ("Tenth session").
// - tma against owner: 9-37% ahead without a mask ("Twentieth session"); under a causal
//   mask owner led until tma took its items in head groups (choose_head_group below), then
//   tma led at every such shape of the sweep, by 0.4-30% ("Twenty-eighth session").
//   Owner mode stays, on request.
inline DqMode choose_dq_mode(const char* requested) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v != "auto" && v != "atomic" && v != "tma" && v != "owner" && v != "flat")
    fail_input("FLASHGPT_ATTENTION_BWD_DQ must be auto, atomic, tma, owner or flat, got '", v, "'");
  if (v == "atomic") return DqMode::atomic;
  if (v == "tma") return DqMode::tma;
  if (v == "owner") return DqMode::owner;
  return DqMode::flat;  // flat, or auto
}

// Whether the sm90 backward in dQ mode `mode` at head dim D stores each key tile's dK and
// dV through shared memory and a TMA store (flash_bwd_sm90.cu, kStageDkDv) rather than each
// thread's own 4-byte global stores: at D = 64 in flat mode up to T = 2048, and under a
// causal mask up to 4096; at D = 128 in tma and flat modes without a mask at every T, and
// under one up to 4096. (Atomic and owner modes never: their kernels have no stage.)
// Measured on an H200, staged against not: at D = 64 ahead by 0.6-7% up to those lengths
// and behind by 1-4% beyond, where an item's one store is rare and the staged loop runs
// slower ("Thirty-fifth session", call 3); at D = 128 ahead by 1.4-7% up to 4K with both
// masks and by 0.6-2% without a mask beyond, level to 2% behind under a causal mask from 8K
// ("Thirty-sixth session", call 2).
inline bool stages_dk_dv(DqMode mode, int D, int T, bool causal) {
  if (D == 64) return mode == DqMode::flat && T <= (causal ? 4096 : 2048);
  return (mode == DqMode::flat || mode == DqMode::tma) && (!causal || T <= 4096);
}

// The fp32 dQ accumulator's floats: (B, H, T, D), with T rounded up to whole query tiles
// of the sm90 backward (128 rows, and at D = 128 80 rows too, the full-mask tile: flat
// mode's accumulator holds whole tiles), and the backward's workspace: the accumulator,
// then 16 bytes for the sm90 backward's work counter (so that the size stays a multiple
// of 16). flash_attention.cu sizes and lays out the workspace by them, and the memory
// plan (train/memory_plan.cpp) counts it.
// kFullFlatRows128: the query tile of flat mode at D = 128 without a mask
// (flash_bwd_sm90.cu's Sm90BwdConfig<128>::FullFlatTile takes it from here).
inline constexpr int kFullFlatRows128 = 80;
inline int64_t dq_accum_floats(int64_t B, int64_t T, int64_t H, int64_t D) {
  constexpr int64_t r = kFullFlatRows128;
  const int64_t rows = std::max((T + 127) / 128 * 128, D == 128 ? (T + r - 1) / r * r : 0);
  return B * H * rows * D;
}
inline int64_t backward_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D) {
  return dq_accum_floats(B, T, H, D) * int64_t(sizeof(float)) + 16;
}

// In tma, flat and atomic modes an item is one key tile of one (batch, head) pair, and the
// blocks claim items in order: groups of `group` pairs one after the other, key tile
// major within a group (every pair's first key tile, then every pair's second, ...;
// causal masks: the longest items first). A group's Q and dO (bf16) and dQ accumulator
// (fp32), T·D·8 bytes a pair, are what its items read again and again. Owner mode runs
// whole pairs and ignores the group.
inline int64_t head_group_bytes(int64_t T, int64_t D) { return T * D * 8; }

// The sm90 backward's key tile (flash_bwd_sm90.cu's kBlockN, which asserts it).
inline constexpr int64_t kBwdKeyTile = 128;

// Whether the sm90 backward in dQ mode `mode` at head dim D claims each item just in time,
// a few steps before it starts (the kernel's kLateClaim: every mode but owner, at both
// head dims), not an item ahead (owner mode: whole (batch, head) units).
constexpr bool claims_just_in_time(DqMode mode, int64_t D) {
  static_cast<void>(D);
  return mode != DqMode::owner;
}

// The group for `requested` (FLASHGPT_ATTENTION_BWD_HEAD_GROUP: auto, all or a positive
// number of pairs; null or empty = auto; anything else is an InputError), on a GPU of `sms`
// SMs, `l2_bytes` of L2 and `dram_bytes_per_s` of peak DRAM bandwidth, for a backward that
// claims just in time or not (claims_just_in_time). Below every pair, auto's group is
// rounded down to a power of two (groups of 24 and 48, which leave a smaller last group at
// the pair counts measured, ran 1-3% behind those of 16, 32 and 64 around them), and it is
// at least 1.
//
// Claims just in time (D = 128): the items claimed together start together, so a group
// whose items fit in one wave of blocks (one an SM) has all its key tiles in flight at
// once, and they read each Q, dO and dQ row of a pair within a few steps of each other.
// auto: SMs / key tiles a pair. Measured on an H100 (BENCHMARKS.md, "Fifty-seventh session",
// calls 4 and 5, groups of 1-16, two rounds): that group (causal and full: 16 at 1K, 8 at
// 2K, 4 at 4K, 2 at 8K, 1 at 16K) was the best measured or within 1.2% of it at every
// shape; groups of twice as many pairs read more from DRAM (Nsight Compute: 2K causal, 16
// against 8, 506 against 407 MB; 4K full, 8 against 4, 894 against 610 MB). On an H200
// (call 7) the claims and this group together ran 2.4-4.4% faster than the H200's groups
// with claims an item ahead at 1K-4K; other groups were not tried there.
//
// Claims an item ahead (D = 64; atomic mode at D = 128): an item starts up to an item after
// its claim, so a group's key tiles read its rows at times an item apart, and the group is
// sized to keep its rows in the L2 instead: as many pairs as fit in a budget (full masks:
// 2/3 of the L2; causal: twice the L2 at D = 64 and four times it at D = 128, since the
// items in flight read a pair's rows from their key tile on, half of them on average, and
// D = 128 measured best with larger groups), at most `sms` / 4 (causal, D = 64: `sms` / 2;
// on a GPU of less than kSlowDram of DRAM bandwidth `sms` / 8 at every shape, below). With
// G pairs in a group the blocks in flight, one an SM, hold about sms / G key tiles of each
// pair, which share its Q, dO and dQ rows in the L2: the cap keeps 2-8 blocks on each.
// Measured on an H200 (132 SMs, 50 MiB of L2, 4.8 TB/s) at the sweep's shapes and
// T = 16K-65,536, groups from 2 to every pair ("Twenty-eighth session", calls 2 and 4;
// "Sixteenth session"; "Twenty-ninth session", call 4): auto's group was the best measured
// at most shapes and within the runs' spread at the rest (D = 128 from 8K, where runs spread
// up to 9%); one group of every pair ran 17-27% behind under a causal mask up to 4K and 2-9%
// behind without a mask. On an H100 (the same SMs and L2, 3.35 TB/s) groups of 16 (about 8
// blocks a pair) ran ahead of the H200's caps at D = 64 ("Fifty-sixth session", call C):
// against 64 (causal) and 32 (full), 4.6% at GPT-2's 64 x 12 x 1K, 3% at 16 x 32 x 1K, 12%
// at 2K, level at 4K, 2% and 5% without a mask at 1K and 2K; and so did they at D = 128
// before its claims were just in time (call B). With less DRAM bandwidth a smaller set of
// rows in flight pays more. A bandwidth of 0 (unknown) takes the H200's caps.
constexpr double kSlowDram = 4e12;  // bytes/s: H100 SXM 3.35e12, H200 4.8e12
inline int64_t choose_head_group(const char* requested, int64_t pairs, int64_t T, int64_t D, bool causal,
                                 int64_t l2_bytes, int64_t sms, double dram_bytes_per_s, bool just_in_time) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v == "all") return pairs;
  if (v != "auto") {
    const int64_t g = parse_positive_int(v, "FLASHGPT_ATTENTION_BWD_HEAD_GROUP", "auto, all or a positive integer", INT64_MAX);
    return std::min<int64_t>(g, pairs);
  }
  int64_t g;
  if (just_in_time) {
    g = sms / ((T + kBwdKeyTile - 1) / kBwdKeyTile);
  } else {
    const int64_t budget = !causal ? l2_bytes * 2 / 3 : D == 64 ? l2_bytes * 2 : l2_bytes * 4;
    const bool slow_dram = dram_bytes_per_s > 0 && dram_bytes_per_s < kSlowDram;
    const int64_t cap = slow_dram ? sms / 8 : sms / (causal && D == 64 ? 2 : 4);
    g = std::min<int64_t>(cap, budget / head_group_bytes(T, D));
  }
  if (g >= pairs) return pairs;
  int64_t p2 = 1;
  while (2 * p2 <= g) p2 *= 2;
  return p2;
}

}  // namespace flashgpt::cuda::attn
