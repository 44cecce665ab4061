// File checksums of checkpoints (train/checkpoint.cpp): CRC-32C (Castagnoli), the CRC
// of iSCSI, ext4 and Btrfs, by the SSE4.2 `crc32` instruction (every x86-64-v2 CPU, the
// level the library is built for): about 6.6 GB/s on one core, where the FNV-1a-style sum
// that checkpoints used before took 0.9 (BENCHMARKS.md, "Forty-ninth session"). Both catch
// accidental damage (a flipped bit, a truncated or zeroed block), not tampering. The old
// sum stays to verify the checkpoints written before (checksums.json as a flat object).
// Both are fed piece by piece, so a file is never held in memory just to be checked.
#pragma once
#include <cstddef>
#include <cstdint>

namespace flashgpt {

struct Crc32c {
  uint32_t state = 0xFFFFFFFFu;
  void add(const char* p, size_t n);
  uint32_t value() const { return ~state; }
};

// The checkpoints' sum before CRC-32C, kept bit for bit: FNV-1a's 64-bit recurrence, but
// from 1469598103934665603, the published offset basis 14695981039346656037 without its
// last digit (so it is not FNV-1a's published function; no weaker for finding damage).
struct LegacyFnv64 {
  uint64_t state = 1469598103934665603ull;
  void add(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      state ^= static_cast<unsigned char>(p[i]);
      state *= 1099511628211ull;
    }
  }
  uint64_t value() const { return state; }
};

}  // namespace flashgpt
