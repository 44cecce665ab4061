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
// in bf16 by the kernel (no zeroed accumulator, no postprocess).
enum class DqMode { atomic, tma, owner };

// auto picks owner, with a causal mask, when the (batch, head) units fill the last wave of
// one block per SM to at least this share.
constexpr double kOwnerWaveFill = 0.9;

// The mode for `requested` (the variable's value: auto, atomic, tma or owner; null or
// empty = auto; anything else is an InputError) at B·H (batch, head) pairs on a GPU of
// `sms` SMs, either head dim. auto: owner for a causal mask whose units fill the last wave
// to at least kOwnerWaveFill, else tma. Measured on an H200 (BENCHMARKS.md): owner beat
// atomic at 128, 256, 512 and 768 units (97% fill; +1 to +9%) and lost at 32, 64 and 192
// (24%, 48%, 73%), seventh session; tma beat atomic on every shape measured and owner beat
// tma at 256, 512 and 768 units (+1 to +6%), tenth session; with owner's own dQ by TMA too,
// owner took 1.065 ms against tma's 1.174-1.181 at 768 units (eleventh session). At
// D = 128 owner beat tma by 3.5-15% at 128 and 256 units (T = 1K, 2K) and took 2-8x as
// long at 16, 32 and 64 (fourteenth session). Those were causal masks; without a mask
// tma beat owner at every such shape, by 9-37% (twentieth session, call 2: D = 64 T = 4K
// 452 against 342 TFLOP/s, D = 128 T = 2K 468 against 344), while with a causal mask
// owner still won by 5-20% (GPT-2's shape 1.01 against 1.18 ms).
inline DqMode choose_dq_mode(const char* requested, int64_t B, int64_t H, bool causal, int64_t sms) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v != "auto" && v != "atomic" && v != "tma" && v != "owner")
    fail_input("FLASHGPT_ATTENTION_BWD_DQ must be auto, atomic, tma or owner, got '", v, "'");
  if (v == "atomic") return DqMode::atomic;
  if (v == "tma") return DqMode::tma;
  if (v == "owner") return DqMode::owner;
  if (!causal) return DqMode::tma;
  const int64_t units = B * H, waves = (units + sms - 1) / sms;
  return double(units) / double(waves * sms) >= kOwnerWaveFill ? DqMode::owner : DqMode::tma;
}

// In tma and atomic modes an item is one key tile of one (batch, head) pair, and the
// blocks claim items in order: groups of `group` pairs one after the other, key tile
// major within a group (every pair's first key tile, then every pair's second, ...;
// causal masks: the longest items first). A group's Q and dO (bf16) and dQ accumulator
// (fp32), T·D·8 bytes a pair, are what its items read again and again: a group that fits
// in the L2 reads them from DRAM about once. Owner mode runs whole pairs and ignores it.
inline int64_t head_group_bytes(int64_t T, int64_t D) { return T * D * 8; }

// The group for `requested` (FLASHGPT_ATTENTION_BWD_HEAD_GROUP: auto, all, or a positive
// number of pairs; null or empty = auto; anything else is an InputError). auto, full
// masks: as many pairs as fit in 2/3 of the L2, at least 1. Causal masks: every pair (one
// group, key tile major), except at D = 64 when one pair's rows fill half the L2 or more
// (T >= 51,200 with 50 MiB): then as many as fit in 4/3 of it. Measured on an H200 (50 MiB
// of L2; BENCHMARKS.md, sixteenth session, backward TFLOP/s or ms, against every pair in
// the same run): full masks gained 2-9% (D = 64, T = 8K and 16K; D = 128, T = 4K-16K;
// groups of 1 or 2 within 1-2% of these either way); D = 64 causal with T = 65,536 (12
// pairs, groups of 2) took 37.76-37.78 ms against 38.25 and the long-context step
// 702-704 against 711-714; but causal groups at T <= 16K lost up to 5% (2 x 32 x 8K,
// groups of 16: 379.0 TFLOP/s against 397.5) or moved either way between calls
// (1 x 32 x 16K, groups of 8: -2.5%, then +1.3%), and at D = 128 (1 x 16 x 16K) every
// group size lost 1-11%.
inline int64_t choose_head_group(const char* requested, int64_t pairs, int64_t T, int64_t D, bool causal,
                                 int64_t l2_bytes) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v == "all") return pairs;
  if (v != "auto") {
    const int64_t g = parse_positive_int(v, "FLASHGPT_ATTENTION_BWD_HEAD_GROUP", "auto, all or a positive integer", INT64_MAX);
    return std::min<int64_t>(g, pairs);
  }
  if (causal && (D == 128 || 2 * head_group_bytes(T, D) < l2_bytes)) return pairs;
  const int64_t budget = causal ? l2_bytes * 4 / 3 : l2_bytes * 2 / 3;
  return std::clamp<int64_t>(budget / head_group_bytes(T, D), 1, pairs);
}

}  // namespace flashgpt::cuda::attn
