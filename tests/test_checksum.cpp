// The checkpoint checksums (src/checksum.h): CRC-32C by the SSE4.2 instruction against
// the polynomial worked bit by bit, at every tail length and fed in random pieces, and at
// its published check values; the old checkpoints' sum at the values its code gave.
#include <gtest/gtest.h>
#include <cstring>
#include <random>
#include <string>
#include "src/checksum.h"
#include "tests/testing.h"

namespace flashgpt {
namespace {

// CRC-32C by its definition: the reflected Castagnoli polynomial 0x82F63B78, one bit at a time.
uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

uint32_t crc32c(const std::string& bytes) {
  Crc32c sum;
  sum.add(bytes.data(), bytes.size());
  return sum.value();
}

TEST(Checksum, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value of CRC-32C
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 (iSCSI), B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // and of ones
}

// The old checkpoints' sum, as the code that wrote them computed it (train/checkpoint.cpp
// until the forty-ninth session): the values are that code's, for these bytes.
TEST(Checksum, LegacySumIsTheOneEarlierCheckpointsHold) {
  const auto legacy = [](const std::string& s) {
    LegacyFnv64 f;
    f.add(s.data(), s.size());
    return f.value();
  };
  EXPECT_EQ(legacy(""), 1469598103934665603ull);
  EXPECT_EQ(legacy("a"), 4953267810257967366ull);
  EXPECT_EQ(legacy("123456789"), 15153102775291180542ull);
}

TEST(Checksum, Crc32cIsThePolynomialAtEveryLengthAndInAnyPieces) {
  std::mt19937_64 rng = test::test_rng();
  for (int n = 0; n < 80; ++n) {  // every tail length, around several 8-byte words
    std::string s(size_t(n), '\0');
    for (char& c : s) c = char(rng());
    ASSERT_EQ(crc32c(s), crc32c_bitwise(s)) << n << " bytes";
  }
  std::string big(size_t(1 << 20) + 13, '\0');
  for (char& c : big) c = char(rng());
  const uint32_t want = crc32c_bitwise(big);
  for (int round = 0; round < 20; ++round) {  // fed in pieces, as files are written and read
    Crc32c sum;
    size_t at = 0;
    while (at < big.size()) {
      const size_t piece = std::min(big.size() - at, size_t(rng() % 70000));
      sum.add(big.data() + at, piece);
      at += piece;
    }
    ASSERT_EQ(sum.value(), want) << "round " << round;
  }
  big[size_t(rng() % big.size())] ^= char(1 << (rng() % 8));  // one flipped bit
  EXPECT_NE(crc32c(big), want);
}

}  // namespace
}  // namespace flashgpt
