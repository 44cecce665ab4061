// GPT-2's pre-tokenisation, written out by hand instead of with a regex library:
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// Text is cut into pieces with this regex first and BPE runs inside each piece, so a
// merge never crosses, e.g., a letter/punctuation boundary.
//   - \p{L}, \p{N}: tables generated from node's Unicode data (data/unicode_tables.h).
//   - \s: Unicode White_Space, as in tiktoken (Rust regex) and the original GPT-2
//     encoder (Python `regex`). JavaScript's \s differs in two code points: it includes
//     U+FEFF and excludes U+0085.
//   - Bytes that are not valid UTF-8 (stray continuation bytes, overlong forms,
//     surrogates, > U+10FFFF) count one by one as a character of the last class
//     ([^\s\p{L}\p{N}]), like U+FFFD would; their bytes are kept as they are.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/utf8.h"  // decode_utf8

namespace flashgpt {

enum class CharClass : uint8_t { letter, number, space, other };

CharClass char_class(uint32_t code_point);

// End (exclusive) of the pre-token that starts at text[pos], pos < text.size().
size_t pretoken_end(std::string_view text, size_t pos);

// Calls emit(std::string_view piece) for every pre-token of text, in order.
template <class Emit>
void for_each_pretoken(std::string_view text, Emit&& emit) {
  for (size_t pos = 0; pos < text.size();) {
    size_t end = pretoken_end(text, pos);
    emit(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace flashgpt
