// UTF-8 decoding, shared by the tokenizer's pre-tokenisation (data/pretokenize.h) and the
// escaping of error messages (src/errors.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace flashgpt {

// Decodes the UTF-8 character at text[pos] (pos < size): its code point (or
// kInvalidCodePoint for an invalid byte) and its length in bytes (1 for an invalid byte).
constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;
struct Utf8Char {
  uint32_t code_point;
  uint32_t length;
};
inline Utf8Char decode_utf8(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t left = text.size() - pos;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {b0, 1};
  uint32_t length, cp, min_cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2, cp = b0 & 0x1F, min_cp = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3, cp = b0 & 0x0F, min_cp = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4, cp = b0 & 0x07, min_cp = 0x10000;
  } else {
    return {kInvalidCodePoint, 1};  // continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (left < length) return {kInvalidCodePoint, 1};
  for (uint32_t i = 1; i < length; ++i) {
    if ((p[i] & 0xC0) != 0x80) return {kInvalidCodePoint, 1};  // not a continuation byte
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
  if (cp < min_cp || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return {kInvalidCodePoint, 1};
  return {cp, length};
}

}  // namespace flashgpt
