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

// Whether the sm90ws forward runs `tile` persistent (one block an SM walking the query
// tiles, flash_fwd_sm90_ws.cu) or a block per query tile. `requested`:
// FLASHGPT_ATTENTION_FWD_SCHEDULE, auto | grid | persistent (null or empty: auto;
// anything else is an InputError). Only the two-consumer tiles have a persistent kernel
// (tile 0, and tile 1 at D = 128): the others always run a block per tile. auto:
// persistent at D = 128 without a mask up to T = 2048, where a block per tile, alone on its
// SM, pays its tile's first loads and its epilogue in the open (cuDNN's forward is
// persistent there). Measured on an H200 (BENCHMARKS.md, "Twenty-fifth session", call 3,
// against a block per tile in the same sweep): 16 x 16 x 1K full 504.9-514.0 against 469.4
// TFLOP/s, 8 x 16 x 2K full 592.4-602.2 against 546.6; from 4K on level or 1-4% behind;
// with a causal mask 14-38% behind (blocks unevenly loaded); at D = 64 two consumers
// persistent lost to the one- and three-consumer tiles at every shape.
inline bool sm90ws_forward_persistent(const char* requested, int tile, int D, int T, bool causal) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v != "auto" && v != "grid" && v != "persistent")
    fail_input("FLASHGPT_ATTENTION_FWD_SCHEDULE must be auto, grid or persistent, got '", v, "'");
  const bool two_consumers = tile == 0 || (tile == 1 && D == 128);
  if (!two_consumers || v == "grid") return false;
  return v == "persistent" || (D == 128 && !causal && T <= 2048);
}

}  // namespace flashgpt::cuda::attn
