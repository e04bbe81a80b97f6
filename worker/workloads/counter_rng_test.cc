// Tests of the counter-based generator: SplitMix64's published outputs, the exact bits-to-float
// map, the init bound's rounding, and golden values that tools/reference/workload_reference.py
// (NumPy) also produces.
#include "worker/workloads/counter_rng.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::workloads {
namespace {

TEST(SplitMix64Test, MatchesTheReferenceSequenceSeededWithZero) {
  // The first outputs of Vigna's splitmix64.c started at state 0.
  EXPECT_EQ(SplitMix64Output(0, 0), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(SplitMix64Output(0, 1), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(SplitMix64Output(0, 2), 0x06C45D188009454FULL);
}

TEST(BitsToSymmetricUniformTest, MapsTheTop24BitsExactlyOntoMinusOneToOne) {
  EXPECT_EQ(BitsToSymmetricUniform(0), -1.0f);
  EXPECT_EQ(BitsToSymmetricUniform(~uint64_t{0}), 1.0f - 0x1p-23f);
  EXPECT_EQ(BitsToSymmetricUniform(uint64_t{1} << 63), 0.0f);
  EXPECT_EQ(BitsToSymmetricUniform((uint64_t{1} << 63) | (uint64_t{1} << 40)), 0x1p-23f);
  // The low 40 bits are ignored.
  EXPECT_EQ(BitsToSymmetricUniform((uint64_t{1} << 40) - 1), -1.0f);
}

TEST(InitBoundTest, IsTheFloat32ReciprocalOfTheFloat32SquareRoot) {
  EXPECT_EQ(InitBound(1), 1.0f);
  EXPECT_EQ(InitBound(4), 0.5f);
  EXPECT_EQ(InitBound(64), 0.125f);
  EXPECT_EQ(InitBound(10), 0x1.43d136p-2f);
  EXPECT_EQ(InitBound(10), 1.0f / std::sqrt(10.0f));
}

TEST(CounterRngTest, MatchesTheNumPyReferenceGoldenValues) {
  EXPECT_EQ(CounterRng(7, (uint64_t{1} << 32) | 3).SymmetricUniform(5), 0x1.b68d94p-1f);
  EXPECT_EQ(CounterRng(7, (uint64_t{1} << 32) | 3).SymmetricUniform(6), 0x1.cdc3e8p-1f);
  EXPECT_EQ(CounterRng(7, (uint64_t{1} << 32) | 3).SymmetricUniform(7), -0x1.597c8p-6f);
}

TEST(CounterRngTest, StreamKeyIsTwoLevelsOfSplitMix64) {
  const uint64_t seed = 7;
  const uint64_t stream = 11;
  const uint64_t key = SplitMix64Output(SplitMix64Output(seed, 0), stream);
  const CounterRng rng(seed, stream);
  for (uint64_t index : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 50}) {
    EXPECT_EQ(rng.Bits(index), SplitMix64Output(key, index));
  }
}

TEST(CounterRngTest, SeedsAndStreamsGiveDifferentValues) {
  EXPECT_NE(CounterRng(0, 0).Bits(0), CounterRng(1, 0).Bits(0));
  EXPECT_NE(CounterRng(0, 0).Bits(0), CounterRng(0, 1).Bits(0));
  EXPECT_NE(CounterRng(0, 0).Bits(0), CounterRng(0, 0).Bits(1));
}

TEST(CounterRngTest, FillScalesEachValueFromTheFirstIndex) {
  const CounterRng rng(3, 4);
  std::vector<float> values(100);
  rng.FillSymmetricUniform(1000, 0.25f, absl::MakeSpan(values));
  for (size_t k = 0; k < values.size(); ++k) {
    EXPECT_EQ(values[k], rng.SymmetricUniform(1000 + k) * 0.25f) << k;
  }
}

TEST(CounterRngTest, ValuesAreUniformInMinusOneToOne) {
  const CounterRng rng(42, 0);
  constexpr int kCount = 100000;
  double sum = 0.0;
  double sum_squares = 0.0;
  for (int k = 0; k < kCount; ++k) {
    const float value = rng.SymmetricUniform(k);
    ASSERT_GE(value, -1.0f);
    ASSERT_LT(value, 1.0f);
    sum += value;
    sum_squares += static_cast<double>(value) * value;
  }
  // Mean 0 and variance 1/3, within about 5 standard errors.
  EXPECT_NEAR(sum / kCount, 0.0, 0.01);
  EXPECT_NEAR(sum_squares / kCount, 1.0 / 3.0, 0.005);
}

}  // namespace
}  // namespace zeroshard::workloads
