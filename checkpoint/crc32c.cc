// CRC32C: slicing-by-8 tables built at compile time, the SSE4.2 crc32 instruction where the CPU
// has it, and zlib's GF(2) polynomial arithmetic for Crc32cCombine.
#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace zeroshard::checkpoint {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reflected

using SliceTables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0] is the byte-at-a-time table; tables[k][b] is the CRC of byte b followed by k zero
// bytes, so eight table lookups advance the state by eight bytes at once.
constexpr SliceTables MakeSliceTables() {
  SliceTables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ kPolynomial : crc >> 1;
    tables[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) {
      const uint32_t previous = tables[k - 1][b];
      tables[k][b] = (previous >> 8) ^ tables[0][previous & 0xFF];
    }
  }
  return tables;
}

constexpr SliceTables kSliceTables = MakeSliceTables();

uint64_t LoadLittleEndian64(const unsigned char* p) {
  uint64_t value;
  std::memcpy(&value, p, sizeof(value));
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  value = __builtin_bswap64(value);
#endif
  return value;
}

// The state is the running register (the CRC before its final xor).
uint32_t UpdatePortable(uint32_t state, const unsigned char* p, size_t n) {
  const auto& t = kSliceTables;
  while (n >= 8) {
    const uint64_t word = LoadLittleEndian64(p) ^ state;
    state = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^
            t[4][(word >> 24) & 0xFF] ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
            t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    state = (state >> 8) ^ t[0][(state ^ *p) & 0xFF];
    ++p;
    --n;
  }
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t UpdateSse42(uint32_t state, const unsigned char* p,
                                                       size_t n) {
  // Byte steps up to an 8-byte boundary, so the 8-byte loads are aligned.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    state = _mm_crc32_u8(state, *p);
    ++p;
    --n;
  }
  uint64_t state64 = state;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    state64 = _mm_crc32_u64(state64, word);
    p += 8;
    n -= 8;
  }
  state = static_cast<uint32_t>(state64);
  while (n > 0) {
    state = _mm_crc32_u8(state, *p);
    ++p;
    --n;
  }
  return state;
}
#endif

using UpdateFn = uint32_t (*)(uint32_t, const unsigned char*, size_t);

UpdateFn SelectUpdate() {
#if defined(__x86_64__)
  if (crc32c_internal::HasSse42()) return UpdateSse42;
#endif
  return UpdatePortable;
}

// (a * b) modulo the polynomial, both bit-reflected (zlib's multmodp): x^0 is bit 31.
uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t product = 0;
  while (true) {
    if (a & m) {
      product ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// powers[k] = x^(2^k) modulo the polynomial, for every k a 64-bit byte count can reach.
constexpr int kPowerCount = 3 + 64;
std::array<uint32_t, kPowerCount> MakePowersOfX() {
  std::array<uint32_t, kPowerCount> powers{};
  uint32_t p = 1u << 30;  // x^1
  for (int k = 0; k < kPowerCount; ++k) {
    powers[k] = p;
    p = MultiplyModP(p, p);
  }
  return powers;
}

// x^(len_bytes * 8) modulo the polynomial.
uint32_t XPowerOfBytes(uint64_t len_bytes) {
  static const std::array<uint32_t, kPowerCount> powers = MakePowersOfX();
  uint32_t p = 1u << 31;  // x^0
  int k = 3;              // bytes to bits: the exponent is len_bytes * 2^3
  while (len_bytes != 0) {
    if (len_bytes & 1) p = MultiplyModP(powers[k], p);
    len_bytes >>= 1;
    ++k;
  }
  return p;
}

}  // namespace

namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~UpdatePortable(~crc, static_cast<const unsigned char*>(data), n);
}

bool HasSse42() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  return ~UpdateSse42(~crc, static_cast<const unsigned char*>(data), n);
#else
  return ExtendPortable(crc, data, n);
#endif
}

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  static const UpdateFn update = SelectUpdate();
  return ~update(~crc, static_cast<const unsigned char*>(data), n);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultiplyModP(XPowerOfBytes(len_b), crc_a) ^ crc_b;
}

}  // namespace zeroshard::checkpoint
