// A random permutation of [0, n) that is computed, not stored: index i maps to
// permute(i) in O(1) memory, so a shuffled epoch over billions of tokens costs nothing
// to set up and its state is just (seed, epoch, position).
//
// How: a 4-round Feistel network is a bijection on 2k-bit integers; "cycle walking"
// (apply it again while the result is >= n) restricts it to [0, n). The domain is the
// smallest power of 4 >= n, so at most ~4 applications are expected per index.
#pragma once
#include <cstdint>

namespace flashgpt {

// splitmix64's finaliser: a fixed, portable 64-bit mix (std:: distributions are not
// the same across standard libraries, which would break determinism).
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed) : n_(n), seed_(mix64(seed)) {
    while (half_bits_ < 32 && (uint64_t(1) << (2 * half_bits_)) < n) ++half_bits_;
    mask_ = (uint64_t(1) << half_bits_) - 1;
  }

  uint64_t size() const { return n_; }

  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do x = feistel(x); while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 4;

  uint64_t feistel(uint64_t x) const {
    uint64_t left = x >> half_bits_, right = x & mask_;
    for (int r = 0; r < kRounds; ++r) {
      uint64_t f = mix64(right ^ (seed_ + uint64_t(r) * 0x632be59bd9b4e019ull)) & mask_;
      uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  uint64_t seed_;
  int half_bits_ = 0;
  uint64_t mask_ = 0;
};

}  // namespace flashgpt
