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
// with or without a mask. With dK and dV staged in both modes (stages_dk_dv below), flat
// ran ahead of tma at D = 128 without a mask, where tma had been auto's choice
// (BENCHMARKS.md, "Thirty-sixth session", call 4, backward ms, two interleaved rounds, one
// binary): 16 x 16 x 1K 0.776-0.777 against 0.781-0.784, 8 x 16 x 2K 1.341-1.345 against
// 1.347-1.350, 4 x 16 x 4K 2.477-2.484 against 2.484-2.488, 2 x 16 x 8K 4.720-4.751
// against 4.773-4.777, 1 x 16 x 16K 9.737-9.795 against 9.757-9.794. Before that staging,
// at D = 128 (BENCHMARKS.md, "Thirty-fourth session", calls 3 and 4, two sweeps, backward
// TFLOP/s, flat against tma, with the preprocess zeroing for both): causal 1K +3.0% and
// +3.7%, 2K to 8K +0.2% to +1.1%, 16K -1.6% and +3.3%; full masks 2K to 16K -0.3% to -1.5%
// in both, 1K -2.6% and +3.8%. Flat against tma on an H200 (BENCHMARKS.md,
// "Thirty-second session", calls 1-3, backward, interleaved): at D = 64 1 x 12 x 65,536
// causal 32.85-33.03 ms against 33.07-33.54 in three calls (with the L2 policy it now
// has, 32.54-32.90), the long step 638.6-642.8 ms against 644.0-644.7 in two; the sweep's
// ten D = 64 shapes +1.4% on average (-2% to +3.6%, one run), GPT-2's shape and step
// level.
// Measured on an H200 (BENCHMARKS.md): tma beat atomic on every shape measured (tenth
// session); without a mask tma beat owner at every shape, by 9-37% (twentieth session,
// call 2). Under a causal mask owner won while tma's items ran key tile major over every
// (batch, head) pair (fourteenth and twentieth sessions: GPT-2's shape 1.01 against
// 1.18 ms; D = 128, T = 1K and 2K, by 3.5-15%), and auto took it where the pairs filled the
// last wave of one block per SM; with tma's items in the head groups of choose_head_group
// below, tma beat owner at all five such shapes of the sweep ("Twenty-eighth session",
// calls 1 and 2, backward TFLOP/s): GPT-2's 64 x 12 x 1K 264-265 against 255-258, D = 64
// 16 x 32 x 1K 259-261 against 256-258, 8 x 32 x 2K 347-351 against 306, 4 x 32 x 4K
// 425-429 against 330-332; D = 128 16 x 16 x 1K 280-282 against 274-275, 8 x 16 x 2K
// 377-381 against 320-322. Owner mode stays, on request.
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
// Measured on an H200, staged against not:
// - D = 64 ("Thirty-fifth session", call 3, backward TFLOP/s in the same sweep): GPT-2's
//   shape (64 x 12 x 1K) 0.835 ms against 0.894, 16 x 32 x 1K full 404.0 against 389.8,
//   8 x 32 x 2K causal 387.2 against 373.7, full 452.3 against 449.7, 4 x 32 x 4K causal
//   453.1 against 447.8; behind from 4K full (482.8 against 488.3) and 8K (full 503.2
//   against 513.7, 16K full 490.3 against 509.0; T = 65,536 causal 33.18 and 32.89 ms
//   against 32.69 and 32.60), where an item's one store is rare and the staged kernel's
//   loop ran slower.
// - D = 128 ("Thirty-sixth session", call 2, backward ms, two interleaved rounds; causal
//   in flat mode, full masks in tma mode, auto's): 16 x 16 x 1K causal 0.534-0.535
//   against 0.574-0.576, full 0.786-0.788 against 0.826; 8 x 16 x 2K causal 0.835 against
//   0.864, full 1.356-1.357 against 1.394; 4 x 16 x 4K causal 1.396-1.397 against
//   1.422-1.423, full 2.499 against 2.534-2.535; 2 x 16 x 8K causal 2.553-2.556 against
//   2.551-2.553, full 4.776-4.892 against 4.870-4.992; 1 x 16 x 16K causal 4.912-5.098
//   against 4.811-5.026, full 9.929-9.941 against 9.992-10.0.
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
// (fp32), T·D·8 bytes a pair, are what its items read again and again: a group that fits
// in the L2 reads them from DRAM about once. Owner mode runs whole pairs and ignores it.
inline int64_t head_group_bytes(int64_t T, int64_t D) { return T * D * 8; }

// The group for `requested` (FLASHGPT_ATTENTION_BWD_HEAD_GROUP: auto, all or a positive
// number of pairs; null or empty = auto; anything else is an InputError), on a GPU of `sms`
// SMs and `l2_bytes` of L2. auto: as many pairs as fit in a budget (full masks: 2/3 of the
// L2; causal: twice the L2 at D = 64 and four times it at D = 128, since the items in
// flight read a pair's rows from their key tile on, half of them on average, and D = 128
// measured best with larger groups), at most `sms` / 4 (causal, D = 64: `sms` / 2), at
// least 1; below every pair, rounded down to a power of two (groups of 24 and 48, which
// leave a smaller last group at the pair counts measured, ran 1-3% behind those of 16,
// 32 and 64 around them). With G pairs in a group the blocks in flight, one an SM, hold
// about sms / G key tiles of each pair, which share its Q, dO and dQ rows in the L2: the
// cap keeps 2-4 blocks on each.
// Measured on an H200 (132 SMs, 50 MiB of L2; BENCHMARKS.md, "Twenty-eighth session",
// calls 2 and 4, two or three rounds, backward TFLOP/s; sixteenth session for T = 65,536):
//   causal, D = 64: GPT-2's 64 x 12 x 1K, groups of 64 264-265 (48: 265, 128: 249,
//     every pair 218-220); 16 x 32 x 1K, 64: 260-261 (32: 257, 128: 244, all: 218);
//     8 x 32 x 2K, 64: 347-351 (32: 344-350, 128: 288, all: 272-274); 4 x 32 x 4K, 32:
//     425-429 (16: 419-420, 64: 404-416, all: 313-314); 2 x 32 x 8K, 16: 475-480 (all:
//     415-470); 1 x 32 x 16K, 8: 472-491 (all: 450-458); 1 x 12 x 16K, every pair (96
//     MiB): 498-500 (8, which left a last group of 4: 466-467; 4: 468-471); 1 x 12 x 32K,
//     4: 487-492 (2: 482, 8: 484-487, all: 480-481); 1 x 12 x 65,536, 2: 37.76-37.78 ms
//     against every pair's 38.25 (sixteenth session; 1-4 within 0.5% of each other in
//     this session's call 1).
//   causal, D = 128: 16 x 16 x 1K, 32: 280-282 (64: 278-281, 128: 238-240, all: 229-231);
//     8 x 16 x 2K, 32: 378-381 (16: 371-372, 64: 375, all: 287-288); 4 x 16 x 4K, 32: 465
//     (16: 456-460, all: 444-446); 2 x 16 x 8K, 16: 490-527 (all: 479-524, a spread of up
//     to 9% in both); 1 x 16 x 16K, 8: 510-519 (all: 502-537); 1 x 16 x 32K, 4: 525-526
//     (8: 525-526, all: 520-521); 1 x 16 x 65,536, 2: 525-527 (4: 524-528, all: 519-524).
//   full masks: 16 x 32 x 1K D 64, 32: 363-365 (the L2 budget alone, 66: 353-355);
//     16 x 16 x 1K D 128, 32: 397-400 (33: 397-398); from T = 2K the budget decides
//     (groups of 4-16 within 1-2% of each other; sixteenth session: 2-9% ahead of every
//     pair).
inline int64_t choose_head_group(const char* requested, int64_t pairs, int64_t T, int64_t D, bool causal,
                                 int64_t l2_bytes, int64_t sms) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v == "all") return pairs;
  if (v != "auto") {
    const int64_t g = parse_positive_int(v, "FLASHGPT_ATTENTION_BWD_HEAD_GROUP", "auto, all or a positive integer", INT64_MAX);
    return std::min<int64_t>(g, pairs);
  }
  const int64_t budget = !causal ? l2_bytes * 2 / 3 : D == 64 ? l2_bytes * 2 : l2_bytes * 4;
  const int64_t g = std::min<int64_t>(sms / (causal && D == 64 ? 2 : 4), budget / head_group_bytes(T, D));
  if (g >= pairs) return pairs;
  int64_t p2 = 1;
  while (2 * p2 <= g) p2 *= 2;
  return p2;
}

}  // namespace flashgpt::cuda::attn
