// exp2 without the MUFU unit: a polynomial on the FMA pipe and an exponent add on the
// integer pipe. The attention kernels take one exp2 per score; on Hopper the MUFU unit
// gives 16 a clock per SM, while the FMA pipes give 128 fused multiply-adds, so moving a
// share of the exp2s here unloads the MUFU unit (and the instruction queue it shares with
// the shared-memory loads and stores). FlashAttention-4 does the same on Blackwell.
//
//   x = max(x, -127)               -inf (masked scores) lands on -127, whose result is +0
//   n = round(x), f = x - n        by the 1.5·2^23 trick: n sits in t's low mantissa bits
//   p = 1 + f·(c1 + f·(c2 + f·(c3 + f·c4)))   2^f on [-1/2, 1/2], p(0) = 1 exactly
//   2^x = p · 2^n                  n added to p's exponent field: bits(p) + (bits(t) << 23)
//
// The coefficients minimise the relative error on [-1/2, 1/2] with p(0) = 1: at most
// 2.9e-6 in fp32 (tests/test_poly_exp2.cpp checks it against std::exp2). Results below
// 2^-126 (x < -126) are not accurate, only tiny and non-negative: with n = -127 the
// exponent add stays non-negative because f >= 0 there and p(f) >= 1.
// Host and device: the CPU tests run the same code.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLASHGPT_POLY_EXP2_FN __host__ __device__ __forceinline__
#else
#define FLASHGPT_POLY_EXP2_FN inline
#endif

namespace flashgpt::cuda::attn {

FLASHGPT_POLY_EXP2_FN float poly_exp2(float x) {
  constexpr float kRound = 12582912.f;  // 1.5·2^23: x + kRound rounds x to an integer
  x = fmaxf(x, -127.f);                 // (-inf too; fmaxf(NaN, -127) is -127)
  const float t = x + kRound;
  const float f = x - (t - kRound);  // in [-1/2, 1/2]
  float p = 0.00958283711f;  // (fmaf: one rounding a step, the same on the host)
  p = fmaf(p, f, 0.0559064634f);
  p = fmaf(p, f, 0.240240991f);
  p = fmaf(p, f, 0.693124175f);
  p = fmaf(p, f, 1.f);
#if defined(__CUDA_ARCH__)
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
#else
  uint32_t pb, tb;
  std::memcpy(&pb, &p, sizeof pb);
  std::memcpy(&tb, &t, sizeof tb);
  const uint32_t r = pb + (tb << 23);
  float out;
  std::memcpy(&out, &r, sizeof out);
  return out;
#endif
}

// Whether the e-th exp2 of a thread's sequence goes to poly_exp2 when every `every`-th
// does (every = 0: none).
constexpr bool poly_exp2_at(int e, int every) { return every > 0 && e % every == every - 1; }

}  // namespace flashgpt::cuda::attn

#undef FLASHGPT_POLY_EXP2_FN
