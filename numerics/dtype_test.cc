// Tests of the fp32 <-> bf16/fp16 conversions against known bit patterns (ties, subnormals,
// overflow, NaN) and, for fp16, against the processor's F16C conversions.
#include "numerics/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace zeroshard::numerics {
namespace {

float FromBits(uint32_t bits) { return BitsToFloat(bits); }

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2);
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_TRUE(IsValidDType(DType::kFloat16));
  EXPECT_FALSE(IsValidDType(static_cast<DType>(7)));
}

TEST(BFloat16Test, KnownPatterns) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  // Ties to even: 0x3f808000 is halfway between 0x3f80 (even) and 0x3f81.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000u)), 0x3f80);
  // 0x3f818000 is halfway between 0x3f81 (odd) and 0x3f82 (even).
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000u)), 0x3f82);
  // Just above and below the tie.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f807fffu)), 0x3f80);
  // Subnormals keep their upper bits, rounded.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000u)), 0x0000);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x0000c000u)), 0x0001);
  // Overflow: the largest float rounds up to Inf; Inf stays Inf.
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  // NaN stays NaN, even when its payload is only in the low bits.
  const uint16_t nan = FloatToBFloat16(FromBits(0x7f800001u));
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(nan)));
}

TEST(BFloat16Test, WideningIsExactAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(h));
    EXPECT_EQ(FloatToBits(f), h << 16);
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToBFloat16(f), h);
    }
  }
}

TEST(Float16Test, KnownPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  // Ties to even: 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Overflow: 65520 is the tie between 65504 and 2^16, so it becomes Inf; just below it stays.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  // Subnormals: 2^-24 is the smallest; 2^-25 is a tie that goes to even (0); above it to 1.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(FloatToHalf(5 * std::ldexp(1.0f, -25)), 0x0002);  // 2.5 units: tie to even 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);      // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);   // rounds up into the normals
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

__attribute__((target("f16c"))) float HardwareHalfToFloat(uint16_t half) { return _cvtsh_ss(half); }

__attribute__((target("f16c"))) uint16_t HardwareFloatToHalf(float value) {
  return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

TEST(Float16Test, WideningMatchesF16cForEveryHalf) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no F16C";
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float mine = HalfToFloat(static_cast<uint16_t>(h));
    const float hardware = HardwareHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(hardware)) {
      EXPECT_TRUE(std::isnan(mine)) << h;
    } else {
      ASSERT_EQ(FloatToBits(mine), FloatToBits(hardware)) << h;
      ASSERT_EQ(FloatToHalf(mine), h);
    }
  }
}

TEST(Float16Test, NarrowingMatchesF16cOnManyFloats) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no F16C";
  // Every 97th bit pattern (about 44 million floats) covers every exponent and both ties.
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 97) {
    const float value = FromBits(static_cast<uint32_t>(bits));
    const uint16_t mine = FloatToHalf(value);
    const uint16_t hardware = HardwareFloatToHalf(value);
    ASSERT_EQ(mine, hardware) << std::hex << bits;
  }
  // Exhaustively around the subnormal and overflow thresholds.
  for (uint32_t bits = 0x33000000u - 4096; bits < 0x38800000u + 4096; bits += 3) {
    ASSERT_EQ(FloatToHalf(FromBits(bits)), HardwareFloatToHalf(FromBits(bits))) << bits;
  }
  for (uint32_t bits = 0x477fe000u - 65536; bits < 0x477ff000u + 65536; ++bits) {
    ASSERT_EQ(FloatToHalf(FromBits(bits)), HardwareFloatToHalf(FromBits(bits))) << bits;
  }
}

}  // namespace
}  // namespace zeroshard::numerics
