#include "src/checksum.h"
#include <cstring>
#include <nmmintrin.h>

namespace flashgpt {

// Eight bytes a `crc32` instruction (one a clock, three clocks' latency: one stream runs
// at a third of the instruction's rate, which is still several times what a disk gives),
// the tail a byte at a time.
void Crc32c::add(const char* p, size_t n) {
  uint64_t c = state;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  uint32_t c32 = uint32_t(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, static_cast<unsigned char>(*p));
  state = c32;
}

}  // namespace flashgpt
