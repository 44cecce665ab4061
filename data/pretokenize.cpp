#include "data/pretokenize.h"

#include <algorithm>
#include <iterator>

#include "data/unicode_tables.h"

namespace flashgpt {

namespace {

// Unicode White_Space (PropList.txt; unchanged since Unicode 6.3).
constexpr unicode::CodeRange kSpaceRanges[] = {
    {0x0009, 0x000D}, {0x0020, 0x0020}, {0x0085, 0x0085}, {0x00A0, 0x00A0}, {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

template <size_t N>
bool in_ranges(const unicode::CodeRange (&ranges)[N], uint32_t cp) {
  // First range whose last >= cp, then check its first.
  auto it = std::lower_bound(std::begin(ranges), std::end(ranges), cp,
                             [](const unicode::CodeRange& r, uint32_t c) { return r.last < c; });
  return it != std::end(ranges) && it->first <= cp;
}

CharClass classify(uint32_t cp) {
  if (cp == kInvalidCodePoint) return CharClass::other;
  if (in_ranges(unicode::kLetterRanges, cp)) return CharClass::letter;
  if (in_ranges(unicode::kNumberRanges, cp)) return CharClass::number;
  if (in_ranges(kSpaceRanges, cp)) return CharClass::space;
  return CharClass::other;
}

// ASCII is most of the text: one table lookup instead of three binary searches.
struct AsciiClasses {
  CharClass c[128];
  AsciiClasses() {
    for (uint32_t i = 0; i < 128; ++i) c[i] = classify(i);
  }
};
const AsciiClasses kAscii;

// The contractions 's 't 're 've 'm 'll 'd (lower case only, as in GPT-2): their
// length, or 0. `pos` is at the apostrophe.
size_t contraction_length(std::string_view text, size_t pos) {
  if (pos + 1 >= text.size()) return 0;
  char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

struct Classified {
  CharClass cls;
  uint32_t length;
};
Classified classify_at(std::string_view text, size_t pos) {
  unsigned char b = static_cast<unsigned char>(text[pos]);
  if (b < 0x80) return {kAscii.c[b], 1};
  Utf8Char ch = decode_utf8(text, pos);
  return {char_class(ch.code_point), ch.length};
}

// End of the run of characters of class `cls` that starts at pos.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    Classified c = classify_at(text, pos);
    if (c.cls != cls) break;
    pos += c.length;
  }
  return pos;
}

}  // namespace

CharClass char_class(uint32_t code_point) {
  return code_point < 128 ? kAscii.c[code_point] : classify(code_point);
}

size_t pretoken_end(std::string_view text, size_t pos) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (text[pos] == '\'') {
    if (size_t n = contraction_length(text, pos)) return pos + n;
  }
  Classified first = classify_at(text, pos);
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    Classified second = classify_at(text, pos + 1);
    if (second.cls != CharClass::space) return run_end(text, pos + 1, second.cls);
  }
  if (first.cls != CharClass::space) return run_end(text, pos, first.cls);

  // `\s+(?!\S)|\s+`: a whitespace run; when a non-space follows it, the run gives up
  // its last character (which starts the next piece, e.g. as the optional space),
  // unless the run is that one character.
  size_t last_start = pos, end = pos;
  while (end < text.size()) {
    Classified c = classify_at(text, end);
    if (c.cls != CharClass::space) break;
    last_start = end;
    end += c.length;
  }
  if (end == text.size()) return end;
  return last_start > pos ? last_start : end;
}

}  // namespace flashgpt
