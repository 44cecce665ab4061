// Which tile shape the attention kernels run (FLASHGPT_ATTENTION_FWD_TILE,
// FLASHGPT_ATTENTION_BWD_TILE). Host-only, so the CPU tests check the rule
// (tests/test_tile_choice.cpp).
#pragma once
#include <string>
#include "src/errors.h"

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

// The sm90ws forward's one-consumer tile: one consumer warpgroup (64 query rows a block)
// and two blocks an SM (flash_fwd_sm90_ws.cu).
constexpr int kSm90WsOneConsumer = 2;

// The sm90ws forward's tile for head dim D, T tokens, causal or not; `requested` < 0
// (the knob unset) chooses. Measured on an H200 (BENCHMARKS.md "Twelfth session", call 3,
// the 21 shapes of the sweep, every tile with the overlapped step): at D = 64 three
// consumers (tile 1, 192 query rows a block) beat two by 14-27% without a mask and by
// 8-16% with a causal mask from T = 2048 on, and lose at causal T = 1024 (234.8 against
// 251.9 TFLOP/s; GPT-2's shape 201.0 against 220.3), where a 192-row block straddles the
// diagonal for more of its keys. At D = 128 tile 1 (64-key tiles) loses at every shape
// (16-24%). Up to T = 1024 at D = 64 one consumer and two blocks an SM beat both
// ("Eighteenth session", call 1: causal 287.1 against 251.8, GPT-2's shape 251.8 against
// 221.7, full 369.1 against 364.2): a block's first loads and its epilogue run under the
// other block's matmuls. From T = 2048 on, and at D = 128, it loses (up to 22%).
inline int sm90ws_forward_tile(int requested, int D, int T, bool causal) {
  if (requested >= 0) return requested;
  if (D == 64 && T <= 1024) return kSm90WsOneConsumer;
  return D == 64 && (!causal || T >= 2048) ? 1 : 0;
}

}  // namespace flashgpt::cuda::attn
