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
// The sm90 backward's key tile (flash_bwd_sm90.cu's kBlockN, which asserts it).
inline constexpr int64_t kBwdKeyTile = 128;

// The group for `requested` (FLASHGPT_ATTENTION_BWD_HEAD_GROUP: auto, all or a positive
// number of pairs; null or empty = auto; anything else is an InputError), on a GPU of `sms`
// SMs. auto: the group whose key tiles fill one wave of blocks (one an SM), SMs / key
// tiles a pair, rounded down to a power of two below every pair (groups of 24 and 48,
// which leave a smaller last group, ran 1-3% behind those of 16, 32 and 64 around them),
// and at least 1: 16 at T = 1K, 8 at 2K, 1 from 16K on 132 SMs.
//
// The rule rests on the kernel's claims (flash_bwd_sm90.cu, kLateClaim): a block claims
// its next item a few steps before it starts, so the items claimed together start
// together, a group's key tiles are all in flight at once, and they read each Q, dO and
// dQ row of a pair within a few steps of each other. Measured (BENCHMARKS.md):
// - D = 128, tma and flat modes, on an H100 ("Fifty-seventh session", calls 4 and 5,
//   groups of 1-16, two rounds): this group was the best measured or within 1.2% of it at
//   every shape; groups of twice as many pairs read more from DRAM (Nsight Compute: 2K
//   causal, 16 against 8, 506 against 407 MB; 4K full, 8 against 4, 894 against 610 MB).
// - D = 64 and atomic mode, on an H100 ("Fifty-eighth session", call 1, groups of 1-32):
//   the best measured at 16 x 32 x 1K causal, 4 x 32 x 4K causal and 1 x 32 x 16K full,
//   1.3% behind 2 at 8 x 32 x 2K full and 0.8% behind 32 at GPT-2's 16 x 12 x 1K.
// Until the fifty-eighth session D = 64 and atomic mode claimed an item ahead, so a group's
// key tiles began up to an item apart, and the group was sized to keep its rows in the
// L2 instead (2/3 of it without a mask, 2-4 times it under a causal one, at most a quarter
// to half of the SMs, an eighth on a GPU of less than 4 TB/s of DRAM bandwidth); that rule
// and those claims ran 0.1-6% behind the claims just in time and this group at every
// D = 64 shape of the sweep on an H100 ("Fifty-eighth session", call 1).
inline int64_t choose_head_group(const char* requested, int64_t pairs, int64_t T, int64_t sms) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v == "all") return pairs;
  if (v != "auto") {
    const int64_t g = parse_positive_int(v, "FLASHGPT_ATTENTION_BWD_HEAD_GROUP", "auto, all or a positive integer", INT64_MAX);
    return std::min<int64_t>(g, pairs);
  }
  const int64_t g = sms / ((T + kBwdKeyTile - 1) / kBwdKeyTile);
  if (g >= pairs) return pairs;
  int64_t p2 = 1;
  while (2 * p2 <= g) p2 *= 2;
  return p2;
}

}  // namespace flashgpt::cuda::attn
