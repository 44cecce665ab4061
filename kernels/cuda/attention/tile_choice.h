// Which tile shape the attention kernels run (FLASHGPT_ATTENTION_FWD_TILE,
// FLASHGPT_ATTENTION_BWD_TILE), and the persistent sm90ws forward's order of query tiles
// (FLASHGPT_ATTENTION_FWD_HEAD_GROUP). Compiled for the host too, so the CPU tests check
// the rules (tests/test_tile_choice.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include "src/errors.h"

#if defined(__CUDACC__)
#define FLASHGPT_HOST_DEVICE __host__ __device__
#else
#define FLASHGPT_HOST_DEVICE
#endif

namespace flashgpt::cuda::attn {

// The knob `var` set to `value` (null or empty: unset): 0 or 1, -1 when unset (each
// kernel's default: 0 everywhere but the sm90ws forward, see sm90ws_forward_tile);
// anything else is an InputError.
inline int parse_tile_choice(const char* var, const char* value) {
  if (!value || !*value) return -1;
  const std::string v = value;
  if (v != "0" && v != "1") fail_input(var, " must be 0 or 1, got '", v, "'");
  return v == "1" ? 1 : 0;
}

// The sm80 kernels' tile (forward and backward): the one requested, tile 0 when unset.
inline int sm80_tile(int requested) { return requested >= 0 ? requested : 0; }

// The sm90ws forward's tile for head dim D, T tokens, causal or not; `requested` < 0
// (the knob unset) chooses. Measured on an H200 (BENCHMARKS.md "Twelfth session", call 3,
// the 21 shapes of the sweep, every tile with the overlapped step): at D = 64 three
// consumers (tile 1, 192 query rows a block) beat two by 14-27% without a mask and by
// 8-16% with a causal mask from T = 2048 on, and lose at causal T = 1024 (234.8 against
// 251.9 TFLOP/s; GPT-2's shape 201.0 against 220.3), where a 192-row block straddles the
// diagonal for more of its keys. At D = 128 tile 1 (64-key tiles) loses at every shape
// (16-24%).
inline int sm90ws_forward_tile(int requested, int D, int T, bool causal) {
  if (requested >= 0) return requested;
  return D == 64 && (!causal || T >= 2048) ? 1 : 0;
}

// The persistent sm90ws forward (FLASHGPT_ATTENTION_FWD_SCHEDULE=persistent) numbers the
// m_blocks query tiles of all `pairs` (batch·head)s in groups of `group` pairs, one group
// after the other; within a group, every pair's last query tile, then every pair's one
// before it, and so on (under a causal mask the longest rows start first). Tile t of that
// order is query tile m_block of pair `pair`. The blocks working at the same time are then
// on the pairs of one group, and share those pairs' K and V in the L2.
struct FwdTile {
  int m_block, pair;
};
FLASHGPT_HOST_DEVICE inline FwdTile persistent_fwd_tile(int t, int m_blocks, int pairs, int group) {
  const int per_group = group * m_blocks, g = t / per_group, r = t % per_group;
  const int rest = pairs - g * group, n = group < rest ? group : rest;  // the last group may be short
  return {m_blocks - 1 - r / n, g * group + r % n};
}

// The K and V a pair's query tiles read: T·D·4 bytes (bf16).
inline int64_t fwd_head_group_bytes(int64_t T, int64_t D) { return T * D * 4; }

// The group for `requested` (FLASHGPT_ATTENTION_FWD_HEAD_GROUP: auto, all, or a positive
// number of pairs; null or empty = auto; anything else is an InputError). auto: as many
// pairs as keep their K and V within half the L2, at least 1.
inline int64_t sm90ws_forward_head_group(const char* requested, int64_t pairs, int64_t T, int64_t D,
                                         int64_t l2_bytes) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v == "all") return pairs;
  if (v != "auto")
    return std::min<int64_t>(parse_positive_int(v, "FLASHGPT_ATTENTION_FWD_HEAD_GROUP", "auto, all or a positive integer"),
                             pairs);
  return std::clamp<int64_t>(l2_bytes / 2 / fwd_head_group_bytes(T, D), 1, pairs);
}

}  // namespace flashgpt::cuda::attn
