// How the sm90 attention backward adds up dQ (FLASHGPT_ATTENTION_BWD_DQ). Host-only, so
// the CPU tests check the rule (tests/test_dq_mode.cpp).
#pragma once
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

// auto picks owner when the (batch, head) units fill the last wave of one block per SM
// to at least this share.
constexpr double kOwnerWaveFill = 0.9;

// The mode for `requested` (the variable's value: auto, atomic, tma or owner; null or
// empty = auto; anything else is an InputError) at B·H (batch, head) pairs on a GPU of
// `sms` SMs, either head dim. auto: owner when the units fill the last wave to at least
// kOwnerWaveFill, else tma. Measured on an H200 (BENCHMARKS.md): owner beat atomic at
// 128, 256, 512 and 768 units (97% fill; +1 to +9%) and lost at 32, 64 and 192 (24%,
// 48%, 73%), seventh session; tma beat atomic on every shape measured and owner beat tma
// at 256, 512 and 768 units (+1 to +6%), tenth session; with owner's own dQ by TMA too,
// owner took 1.065 ms against tma's 1.174-1.181 at 768 units (eleventh session). At
// D = 128 owner beat tma by 3.5-15% at 128 and 256 units (T = 1K, 2K) and took 2-8x as
// long at 16, 32 and 64 (fourteenth session).
inline DqMode choose_dq_mode(const char* requested, int64_t B, int64_t H, int64_t sms) {
  const std::string v = requested && *requested ? requested : "auto";
  if (v != "auto" && v != "atomic" && v != "tma" && v != "owner")
    fail_input("FLASHGPT_ATTENTION_BWD_DQ must be auto, atomic, tma or owner, got '", v, "'");
  if (v == "atomic") return DqMode::atomic;
  if (v == "tma") return DqMode::tma;
  if (v == "owner") return DqMode::owner;
  const int64_t units = B * H, waves = (units + sms - 1) / sms;
  return double(units) / double(waves * sms) >= kOwnerWaveFill ? DqMode::owner : DqMode::tma;
}

}  // namespace flashgpt::cuda::attn
