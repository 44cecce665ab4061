// bfloat16 on the host: the top 16 bits of an IEEE float (1 sign, 8 exponent, 7
// mantissa bits), stored as uint16_t. Conversions round to nearest, ties to even,
// like the hardware (__float2bfloat16_rn). NaN stays NaN (quiet); overflow goes to inf.
// Header-only and host-only; the CUDA side uses cuda_bf16.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashgpt {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Exact: every bf16 value is a float.
inline float bf16_to_float(uint16_t h) { return float_from_bits(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  constexpr uint32_t kQuietNaN = 0x7FC0;
  const uint32_t u = float_bits(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | kQuietNaN);  // keep the sign, stay NaN
  // Adding 0x7FFF rounds up exactly when the dropped 16 bits exceed half; on a tie,
  // the kept LSB decides, which makes the result even. A carry into the exponent is
  // the correct rounding (up to the next binade, or to inf past the largest value).
  const uint32_t kept_lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7FFFu + kept_lsb) >> 16);
}

// double -> bf16 correctly rounded. Going through a plain (nearest) float rounding
// could round twice (a double just above a bf16 tie could land on the tie in float and
// then go to even). Rounding to float *to odd* first keeps the information that the
// value was not exactly representable, and that is enough because float has 16 bits
// more than bf16 (round-to-odd is safe with >= 2 extra bits).
inline uint16_t double_to_bf16(double d) {
  if (std::isnan(d)) return float_to_bf16(float(d));
  float f = float(d);                                   // nearest
  if (std::fabs(double(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // now truncated
  if (double(f) != d) f = float_from_bits(float_bits(f) | 1u);          // sticky -> odd
  return float_to_bf16(f);
}

inline double bf16_to_double(uint16_t h) { return double(bf16_to_float(h)); }

}  // namespace flashgpt
