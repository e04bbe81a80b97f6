// Tests for CRC32C: the standard vectors, both implementations against a bit-at-a-time
// reference at every length and alignment, piecewise extension and Crc32cCombine.
#include "checkpoint/crc32c.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

using Extend = uint32_t (*)(uint32_t, const void*, size_t);

// The definition, one bit at a time: independent of both implementations' tables.
uint32_t ReferenceCrc32c(const unsigned char* p, size_t n) {
  uint32_t state = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    state ^= p[i];
    for (int bit = 0; bit < 8; ++bit) state = (state & 1) ? (state >> 1) ^ 0x82F63B78u : state >> 1;
  }
  return ~state;
}

std::vector<unsigned char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

struct Implementation {
  const char* name;
  Extend extend;
};

std::vector<Implementation> Implementations() {
  std::vector<Implementation> result = {{"dispatch", &Crc32cExtend},
                                        {"portable", &crc32c_internal::ExtendPortable}};
  if (crc32c_internal::HasSse42()) result.push_back({"sse4.2", &crc32c_internal::ExtendSse42});
  return result;
}

TEST(Crc32cTest, StandardVectors) {
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<unsigned char>(i);
    descending[i] = static_cast<unsigned char>(31 - i);
  }
  const std::string digits = "123456789";
  for (const Implementation& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.extend(0, zeros.data(), zeros.size()), 0x8A9136AAu);
    EXPECT_EQ(impl.extend(0, ones.data(), ones.size()), 0x62A8AB43u);
    EXPECT_EQ(impl.extend(0, ascending.data(), ascending.size()), 0x46DD794Eu);
    EXPECT_EQ(impl.extend(0, descending.data(), descending.size()), 0x113FDB5Cu);
    EXPECT_EQ(impl.extend(0, digits.data(), digits.size()), 0xE3069283u);
    EXPECT_EQ(impl.extend(0, digits.data(), 0), 0u);
  }
  EXPECT_EQ(Crc32c(digits.data(), digits.size()), 0xE3069283u);
}

TEST(Crc32cTest, ThisMachineHasTheHardwarePath) {
  // Every x86-64 CPU since 2008 has SSE4.2; the agreement tests below would compare the portable
  // path with itself without it, so say so instead of passing quietly.
#if defined(__x86_64__)
  EXPECT_TRUE(crc32c_internal::HasSse42());
#else
  GTEST_SKIP() << "not x86-64: only the portable path exists";
#endif
}

TEST(Crc32cTest, EveryLengthAndMisalignmentMatchesTheReference) {
  const std::vector<unsigned char> bytes = RandomBytes(300 + 16, 12);
  for (const Implementation& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    for (size_t offset = 0; offset < 16; ++offset) {
      for (size_t n = 0; n <= 300; ++n) {
        const unsigned char* p = bytes.data() + offset;
        ASSERT_EQ(impl.extend(0, p, n), ReferenceCrc32c(p, n)) << "offset " << offset << " n " << n;
      }
    }
  }
}

TEST(Crc32cTest, ExtendingInPiecesEqualsOneCall) {
  const std::vector<unsigned char> bytes = RandomBytes(5000, 7);
  const uint32_t whole = ReferenceCrc32c(bytes.data(), bytes.size());
  std::mt19937 rng(3);
  for (const Implementation& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    for (int trial = 0; trial < 50; ++trial) {
      uint32_t crc = 0;
      size_t at = 0;
      while (at < bytes.size()) {
        const size_t piece = std::min<size_t>(bytes.size() - at, rng() % 700);
        crc = impl.extend(crc, bytes.data() + at, piece);
        at += piece;
      }
      ASSERT_EQ(crc, whole) << "trial " << trial;
    }
  }
}

TEST(Crc32cTest, CombineEqualsTheChecksumOfTheConcatenation) {
  const std::vector<unsigned char> bytes = RandomBytes(70000, 5);
  for (size_t split :
       {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{4096}, size_t{69999}, size_t{70000}}) {
    const uint32_t a = Crc32c(bytes.data(), split);
    const uint32_t b = Crc32c(bytes.data() + split, bytes.size() - split);
    EXPECT_EQ(Crc32cCombine(a, b, bytes.size() - split), Crc32c(bytes.data(), bytes.size()))
        << "split " << split;
  }
  // A long run of zeros: the exponent walks many powers of x.
  const std::vector<unsigned char> zeros(1 << 20, 0);
  const uint32_t head = Crc32c(bytes.data(), 100);
  std::vector<unsigned char> joined(bytes.begin(), bytes.begin() + 100);
  joined.insert(joined.end(), zeros.begin(), zeros.end());
  EXPECT_EQ(Crc32cCombine(head, Crc32c(zeros.data(), zeros.size()), zeros.size()),
            Crc32c(joined.data(), joined.size()));
}

}  // namespace
}  // namespace zeroshard::checkpoint
