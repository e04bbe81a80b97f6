// Tests of the CPU gradient statistics: the sum of squares against an exact reference, the same
// bits across thread counts and instruction sets, and NaN/Inf detection in every position.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_optimizer.h"
#include "kernels/dtype.h"

namespace zeroshard::kernels {
namespace {

// Relative tolerance against the long-double reference: fp64 accumulation of n terms loses at
// most about n * 2^-53 relative; the sizes here keep that under 1e-10.
constexpr double kRelTol = 1e-10;

struct Buffers {
  std::vector<std::vector<unsigned char>> storage;
  std::vector<GradPiece> pieces;
  long double reference = 0.0L;
};

// Pieces of random values of `dtype`, each starting `k % 4` elements past an aligned address.
Buffers MakePieces(const std::vector<int64_t>& lengths, DType dtype, uint32_t seed) {
  Buffers b;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const int size = DTypeSize(dtype);
  for (size_t k = 0; k < lengths.size(); ++k) {
    const int64_t offset = k % 4;
    b.storage.emplace_back((lengths[k] + offset) * size);
    unsigned char* base = b.storage.back().data() + offset * size;
    for (int64_t i = 0; i < lengths[k]; ++i) {
      const float x = uniform(rng);
      float widened = x;
      if (dtype == DType::kFloat32) {
        std::memcpy(base + 4 * i, &x, 4);
      } else {
        const uint16_t h = dtype == DType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
        std::memcpy(base + 2 * i, &h, 2);
        widened = dtype == DType::kBFloat16 ? BFloat16ToFloat(h) : HalfToFloat(h);
      }
      b.reference += static_cast<long double>(widened) * widened;
    }
    b.pieces.push_back(GradPiece{base, dtype, lengths[k]});
  }
  return b;
}

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

class GradStatsTest : public ::testing::TestWithParam<DType> {};

TEST_P(GradStatsTest, MatchesReferenceAndIsBitwiseStable) {
  const std::vector<int64_t> lengths = {0, 1, 15, 16, 17, 1000, 3 * kCpuChunkElements + 5, 7};
  Buffers b = MakePieces(lengths, GetParam(), 11);
  absl::StatusOr<GradStats> first = ComputeGradStatsCpu(b.pieces, nullptr, SimdLevel::kScalar);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->non_finite);
  EXPECT_NEAR(first->sum_squares, static_cast<double>(b.reference),
              kRelTol * static_cast<double>(b.reference));
  for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!SimdLevelSupported(simd)) continue;
    for (int threads : {1, 2, 3}) {
      std::unique_ptr<ThreadPool> pool;
      if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
      absl::StatusOr<GradStats> stats = ComputeGradStatsCpu(b.pieces, pool.get(), simd);
      ASSERT_TRUE(stats.ok());
      EXPECT_EQ(Bits(stats->sum_squares), Bits(first->sum_squares))
          << SimdLevelName(simd) << " " << threads << " threads";
      EXPECT_FALSE(stats->non_finite);
    }
  }
}

TEST_P(GradStatsTest, DetectsNonFiniteInEveryPosition) {
  const DType dtype = GetParam();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  const int size = DTypeSize(dtype);
  for (float special : specials) {
    // Every position of a piece longer than two vectors, in every instruction set.
    Buffers b = MakePieces({2, 37, 3}, dtype, 12);
    unsigned char* data = static_cast<unsigned char*>(const_cast<void*>(b.pieces[1].data));
    for (int64_t pos = 0; pos < 37; ++pos) {
      std::vector<unsigned char> saved(data + pos * size, data + (pos + 1) * size);
      if (dtype == DType::kFloat32) {
        std::memcpy(data + pos * size, &special, 4);
      } else {
        const uint16_t h =
            dtype == DType::kBFloat16 ? FloatToBFloat16(special) : FloatToHalf(special);
        std::memcpy(data + pos * size, &h, 2);
      }
      for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!SimdLevelSupported(simd)) continue;
        absl::StatusOr<GradStats> stats = ComputeGradStatsCpu(b.pieces, nullptr, simd);
        ASSERT_TRUE(stats.ok());
        EXPECT_TRUE(stats->non_finite) << special << " at " << pos << " " << SimdLevelName(simd);
      }
      std::memcpy(data + pos * size, saved.data(), size);
    }
    absl::StatusOr<GradStats> clean = ComputeGradStatsCpu(b.pieces, nullptr);
    ASSERT_TRUE(clean.ok());
    EXPECT_FALSE(clean->non_finite);
  }
}

TEST_P(GradStatsTest, DetectsNonFiniteInLargePieces) {
  const DType dtype = GetParam();
  const int64_t n = 2 * kCpuChunkElements + 19;
  const int size = DTypeSize(dtype);
  ThreadPool pool(2);
  for (int64_t pos : {int64_t{0}, kCpuChunkElements - 1, kCpuChunkElements, n - 1}) {
    Buffers b = MakePieces({n}, dtype, 13);
    unsigned char* data = static_cast<unsigned char*>(const_cast<void*>(b.pieces[0].data));
    const float inf = std::numeric_limits<float>::infinity();
    if (dtype == DType::kFloat32) {
      std::memcpy(data + pos * size, &inf, 4);
    } else {
      const uint16_t h = dtype == DType::kBFloat16 ? FloatToBFloat16(inf) : FloatToHalf(inf);
      std::memcpy(data + pos * size, &h, 2);
    }
    absl::StatusOr<GradStats> stats = ComputeGradStatsCpu(b.pieces, &pool);
    ASSERT_TRUE(stats.ok());
    EXPECT_TRUE(stats->non_finite) << pos;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, GradStatsTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(GradStatsTest, LargestFloatsStayFinite) {
  std::vector<float> big(1000, std::numeric_limits<float>::max());
  absl::StatusOr<GradStats> stats =
      ComputeGradStatsCpu({GradPiece{big.data(), DType::kFloat32, 1000}}, nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_FALSE(stats->non_finite);
  const double max = std::numeric_limits<float>::max();
  EXPECT_NEAR(stats->sum_squares, 1000.0 * max * max, 1e-12 * 1000.0 * max * max);
}

TEST(GradStatsTest, EmptyAndInvalid) {
  absl::StatusOr<GradStats> empty = ComputeGradStatsCpu({}, nullptr);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->sum_squares, 0.0);
  EXPECT_FALSE(empty->non_finite);
  EXPECT_EQ(ComputeGradStatsCpu({GradPiece{nullptr, DType::kFloat32, 3}}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  float x = 1.0f;
  EXPECT_EQ(ComputeGradStatsCpu({GradPiece{&x, static_cast<DType>(5), 1}}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zeroshard::kernels
