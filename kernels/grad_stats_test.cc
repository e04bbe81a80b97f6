// Tests of the CPU gradient statistics: the sum of squares against an exact reference, the same
// bits across thread counts and instruction sets, and NaN/Inf detection in every position; and
// the statistics summed on a conversion's pass against the conversion followed by that pass.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_optimizer.h"
#include "numerics/dtype.h"

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
Buffers MakePieces(const std::vector<int64_t>& lengths, numerics::DType dtype, uint32_t seed) {
  Buffers b;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const int size = numerics::DTypeSize(dtype);
  for (size_t k = 0; k < lengths.size(); ++k) {
    const int64_t offset = k % 4;
    b.storage.emplace_back((lengths[k] + offset) * size);
    unsigned char* base = b.storage.back().data() + offset * size;
    for (int64_t i = 0; i < lengths[k]; ++i) {
      const float x = uniform(rng);
      float widened = x;
      if (dtype == numerics::DType::kFloat32) {
        std::memcpy(base + 4 * i, &x, 4);
      } else {
        const uint16_t h = dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(x)
                                                               : numerics::FloatToHalf(x);
        std::memcpy(base + 2 * i, &h, 2);
        widened = dtype == numerics::DType::kBFloat16 ? numerics::BFloat16ToFloat(h)
                                                      : numerics::HalfToFloat(h);
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

class GradStatsTest : public ::testing::TestWithParam<numerics::DType> {};

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
  const numerics::DType dtype = GetParam();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  const int size = numerics::DTypeSize(dtype);
  for (float special : specials) {
    // Every position of a piece longer than two vectors, in every instruction set.
    Buffers b = MakePieces({2, 37, 3}, dtype, 12);
    unsigned char* data = static_cast<unsigned char*>(const_cast<void*>(b.pieces[1].data));
    for (int64_t pos = 0; pos < 37; ++pos) {
      std::vector<unsigned char> saved(data + pos * size, data + (pos + 1) * size);
      if (dtype == numerics::DType::kFloat32) {
        std::memcpy(data + pos * size, &special, 4);
      } else {
        const uint16_t h = dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(special)
                                                               : numerics::FloatToHalf(special);
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
  const numerics::DType dtype = GetParam();
  const int64_t n = 2 * kCpuChunkElements + 19;
  const int size = numerics::DTypeSize(dtype);
  ThreadPool pool(2);
  for (int64_t pos : {int64_t{0}, kCpuChunkElements - 1, kCpuChunkElements, n - 1}) {
    Buffers b = MakePieces({n}, dtype, 13);
    unsigned char* data = static_cast<unsigned char*>(const_cast<void*>(b.pieces[0].data));
    const float inf = std::numeric_limits<float>::infinity();
    if (dtype == numerics::DType::kFloat32) {
      std::memcpy(data + pos * size, &inf, 4);
    } else {
      const uint16_t h = dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(inf)
                                                             : numerics::FloatToHalf(inf);
      std::memcpy(data + pos * size, &h, 2);
    }
    absl::StatusOr<GradStats> stats = ComputeGradStatsCpu(b.pieces, &pool);
    ASSERT_TRUE(stats.ok());
    EXPECT_TRUE(stats->non_finite) << pos;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, GradStatsTest,
                         ::testing::Values(numerics::DType::kFloat32, numerics::DType::kBFloat16,
                                           numerics::DType::kFloat16),
                         [](const ::testing::TestParamInfo<numerics::DType>& info) {
                           return std::string(numerics::DTypeName(info.param));
                         });

TEST(GradStatsTest, LargestFloatsStayFinite) {
  std::vector<float> big(1000, std::numeric_limits<float>::max());
  absl::StatusOr<GradStats> stats =
      ComputeGradStatsCpu({GradPiece{big.data(), numerics::DType::kFloat32, 1000}}, nullptr);
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
  EXPECT_EQ(ComputeGradStatsCpu({GradPiece{nullptr, numerics::DType::kFloat32, 3}}, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  float x = 1.0f;
  EXPECT_EQ(ComputeGradStatsCpu({GradPiece{&x, static_cast<numerics::DType>(5), 1}}, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- ConvertWithGradStatsCpu: the statistics summed on a conversion's pass ----

// The fp32 value of element i of `data` (of `dtype`).
float ValueAt(const unsigned char* data, numerics::DType dtype, int64_t i) {
  if (dtype == numerics::DType::kFloat32) {
    float value;
    std::memcpy(&value, data + 4 * i, 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, data + 2 * i, 2);
  return dtype == numerics::DType::kBFloat16 ? numerics::BFloat16ToFloat(bits)
                                             : numerics::HalfToFloat(bits);
}

// Sets element i of `data` (of `dtype`) to `value`, rounded to nearest even.
void SetValue(unsigned char* data, numerics::DType dtype, int64_t i, float value) {
  if (dtype == numerics::DType::kFloat32) {
    std::memcpy(data + 4 * i, &value, 4);
    return;
  }
  const uint16_t bits = dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(value)
                                                            : numerics::FloatToHalf(value);
  std::memcpy(data + 2 * i, &bits, 2);
}

// One buffer holding pieces of `lengths` one after another, with `gap` elements before each, as
// a reduced bucket holds tensor fragments between alignment gaps. `chunks` cut every piece into
// chunks of kCpuChunkElements from its start; `pieces` are the pieces' places (in `data`).
struct ChunkedBuffer {
  numerics::DType dtype = numerics::DType::kFloat32;
  std::vector<unsigned char> data;
  std::vector<GradStatsChunk> chunks;
  std::vector<GradPiece> pieces;
  int64_t elements = 0;
};

ChunkedBuffer MakeChunkedBuffer(const std::vector<int64_t>& lengths, int64_t gap,
                                numerics::DType dtype, uint32_t seed) {
  ChunkedBuffer b;
  b.dtype = dtype;
  for (int64_t length : lengths) b.elements += gap + length;
  b.data.resize(b.elements * numerics::DTypeSize(dtype));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  for (int64_t i = 0; i < b.elements; ++i) SetValue(b.data.data(), dtype, i, uniform(rng));
  int64_t begin = 0;
  for (int64_t length : lengths) {
    begin += gap;
    for (int64_t offset = 0; offset < length; offset += kCpuChunkElements) {
      b.chunks.push_back(
          GradStatsChunk{begin + offset, std::min(kCpuChunkElements, length - offset)});
    }
    b.pieces.push_back(GradPiece{nullptr, dtype, length});
    begin += length;
  }
  return b;
}

// `pieces` of `b` placed in `data` (a buffer of b's layout in `dtype`).
std::vector<GradPiece> PiecesIn(const ChunkedBuffer& b, const unsigned char* data,
                                numerics::DType dtype, int64_t gap) {
  std::vector<GradPiece> pieces;
  int64_t begin = 0;
  for (const GradPiece& piece : b.pieces) {
    begin += gap;
    pieces.push_back(GradPiece{data + begin * numerics::DTypeSize(dtype), dtype, piece.length});
    begin += piece.length;
  }
  return pieces;
}

// What ConvertElements leaves in a destination of `dst_dtype`: element by element through fp32
// (equal dtypes: the bits).
std::vector<unsigned char> ConvertedReference(const ChunkedBuffer& src, numerics::DType dst_dtype) {
  if (src.dtype == dst_dtype) return src.data;
  std::vector<unsigned char> dst(src.elements * numerics::DTypeSize(dst_dtype));
  for (int64_t i = 0; i < src.elements; ++i) {
    SetValue(dst.data(), dst_dtype, i, ValueAt(src.data.data(), src.dtype, i));
  }
  return dst;
}

// Whether elements of two buffers of `dtype` hold the same bits, treating every NaN as equal
// to every other (a conversion may quiet a NaN).
::testing::AssertionResult SameElements(const std::vector<unsigned char>& expected,
                                        const std::vector<unsigned char>& actual,
                                        numerics::DType dtype, int64_t begin, int64_t end) {
  const int size = numerics::DTypeSize(dtype);
  for (int64_t i = begin; i < end; ++i) {
    if (std::memcmp(expected.data() + i * size, actual.data() + i * size, size) == 0) continue;
    if (std::isnan(ValueAt(expected.data(), dtype, i)) &&
        std::isnan(ValueAt(actual.data(), dtype, i))) {
      continue;
    }
    return ::testing::AssertionFailure()
           << "element " << i << ": expected " << ValueAt(expected.data(), dtype, i) << ", got "
           << ValueAt(actual.data(), dtype, i);
  }
  return ::testing::AssertionSuccess();
}

constexpr int64_t kGap = 3;
// Odd lengths, one shorter than a vector, pieces of exactly 16 and of several chunks.
const std::vector<int64_t>& TestLengths() {
  static const std::vector<int64_t>* lengths =
      new std::vector<int64_t>{1, 15, 16, 17, 1001, 2 * kCpuChunkElements + 37, 0, 7};
  return *lengths;
}

struct DTypePair {
  numerics::DType src;
  numerics::DType dst;
};

class ConvertWithGradStatsTest : public ::testing::TestWithParam<DTypePair> {};

TEST_P(ConvertWithGradStatsTest, WritesWhatConvertWritesAndSumsWhatComputeGradStatsSums) {
  const DTypePair dtypes = GetParam();
  const ChunkedBuffer src = MakeChunkedBuffer(TestLengths(), kGap, dtypes.src, 21);
  const std::vector<unsigned char> converted = ConvertedReference(src, dtypes.dst);
  // The unfused passes: the conversion, then the statistics over what it wrote.
  absl::StatusOr<GradStats> reference =
      ComputeGradStatsCpu(PiecesIn(src, converted.data(), dtypes.dst, kGap), nullptr);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_FALSE(reference->non_finite);
  const unsigned char kSentinel = 0xa5;
  for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!SimdLevelSupported(simd)) continue;
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << SimdLevelName(simd) << ", " << threads << " threads");
      std::unique_ptr<ThreadPool> pool;
      if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
      std::vector<unsigned char> dst(converted.size(), kSentinel);
      std::vector<double> partials(src.chunks.size(), -1.0);
      ASSERT_TRUE(ConvertWithGradStatsCpu(src.data.data(), dtypes.src, dst.data(), dtypes.dst,
                                          src.chunks, partials.data(), pool.get(), simd)
                      .ok());
      const GradStats combined = CombineGradStatsCpu(partials);
      EXPECT_EQ(Bits(combined.sum_squares), Bits(reference->sum_squares));
      EXPECT_FALSE(combined.non_finite);
      // Chunks are converted, and only chunks: the gaps between them keep what they held.
      const int size = numerics::DTypeSize(dtypes.dst);
      int64_t covered_to = 0;
      for (const GradStatsChunk& chunk : src.chunks) {
        for (int64_t i = covered_to * size; i < chunk.begin * size; ++i) {
          ASSERT_EQ(dst[i], kSentinel) << "byte " << i << " outside every chunk was written";
        }
        EXPECT_TRUE(
            SameElements(converted, dst, dtypes.dst, chunk.begin, chunk.begin + chunk.length));
        covered_to = chunk.begin + chunk.length;
      }
    }
  }
}

TEST_P(ConvertWithGradStatsTest, EachPartialIsItsChunksSumOfSquares) {
  const DTypePair dtypes = GetParam();
  const ChunkedBuffer src = MakeChunkedBuffer(TestLengths(), kGap, dtypes.src, 22);
  std::vector<unsigned char> dst(src.elements * numerics::DTypeSize(dtypes.dst));
  std::vector<double> partials(src.chunks.size());
  ASSERT_TRUE(ConvertWithGradStatsCpu(src.data.data(), dtypes.src, dst.data(), dtypes.dst,
                                      src.chunks, partials.data(), nullptr)
                  .ok());
  for (size_t k = 0; k < src.chunks.size(); ++k) {
    const GradStatsChunk& chunk = src.chunks[k];
    const GradPiece piece{dst.data() + chunk.begin * numerics::DTypeSize(dtypes.dst), dtypes.dst,
                          chunk.length};
    absl::StatusOr<GradStats> alone = ComputeGradStatsCpu({piece}, nullptr);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(Bits(partials[k]), Bits(alone->sum_squares)) << "chunk " << k;
  }
}

TEST_P(ConvertWithGradStatsTest, FindsNaNAndInfinityWhereverTheyAre) {
  const DTypePair dtypes = GetParam();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  ChunkedBuffer src = MakeChunkedBuffer({37, kCpuChunkElements + 21, 5}, kGap, dtypes.src, 23);
  // Every position of a short piece (whole vectors and the tail), and the second chunk of a
  // long one.
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < 37; ++i) positions.push_back(kGap + i);
  positions.push_back(2 * kGap + 37 + kCpuChunkElements + 20);
  for (float special : specials) {
    for (int64_t position : positions) {
      const float saved = ValueAt(src.data.data(), dtypes.src, position);
      SetValue(src.data.data(), dtypes.src, position, special);
      for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!SimdLevelSupported(simd)) continue;
        std::vector<unsigned char> dst(src.elements * numerics::DTypeSize(dtypes.dst));
        std::vector<double> partials(src.chunks.size());
        ASSERT_TRUE(ConvertWithGradStatsCpu(src.data.data(), dtypes.src, dst.data(), dtypes.dst,
                                            src.chunks, partials.data(), nullptr, simd)
                        .ok());
        EXPECT_TRUE(CombineGradStatsCpu(partials).non_finite)
            << special << " at " << position << ", " << SimdLevelName(simd);
        const float moved = ValueAt(dst.data(), dtypes.dst, position);
        EXPECT_EQ(std::isnan(moved), std::isnan(special)) << position;
        EXPECT_EQ(std::isinf(moved), std::isinf(special)) << position;
      }
      SetValue(src.data.data(), dtypes.src, position, saved);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDTypePairs, ConvertWithGradStatsTest,
    ::testing::Values(DTypePair{numerics::DType::kFloat32, numerics::DType::kFloat32},
                      DTypePair{numerics::DType::kFloat32, numerics::DType::kBFloat16},
                      DTypePair{numerics::DType::kFloat32, numerics::DType::kFloat16},
                      DTypePair{numerics::DType::kBFloat16, numerics::DType::kFloat32},
                      DTypePair{numerics::DType::kBFloat16, numerics::DType::kBFloat16},
                      DTypePair{numerics::DType::kBFloat16, numerics::DType::kFloat16},
                      DTypePair{numerics::DType::kFloat16, numerics::DType::kFloat32},
                      DTypePair{numerics::DType::kFloat16, numerics::DType::kBFloat16},
                      DTypePair{numerics::DType::kFloat16, numerics::DType::kFloat16}),
    [](const ::testing::TestParamInfo<DTypePair>& info) {
      return std::string(numerics::DTypeName(info.param.src)) + "_to_" +
             numerics::DTypeName(info.param.dst);
    });

// The statistics are of the converted values: an fp32 gradient above fp16's range becomes Inf
// in fp16 storage (a step to skip), while bf16 holds it.
TEST(ConvertWithGradStatsTest, NarrowingOverflowIsNonFinite) {
  std::vector<float> src(40, 0.5f);
  src[33] = 70000.0f;
  const std::vector<GradStatsChunk> chunks = {GradStatsChunk{0, 40}};
  for (numerics::DType dst_dtype : {numerics::DType::kFloat16, numerics::DType::kBFloat16}) {
    for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (!SimdLevelSupported(simd)) continue;
      std::vector<uint16_t> dst(40);
      double partial = 0.0;
      ASSERT_TRUE(ConvertWithGradStatsCpu(src.data(), numerics::DType::kFloat32, dst.data(),
                                          dst_dtype, chunks, &partial, nullptr, simd)
                      .ok());
      EXPECT_EQ(CombineGradStatsCpu({partial}).non_finite, dst_dtype == numerics::DType::kFloat16)
          << numerics::DTypeName(dst_dtype) << " " << SimdLevelName(simd);
    }
  }
}

TEST_P(GradStatsTest, ConvertWithGradStatsInPlaceOnlySums) {
  const numerics::DType dtype = GetParam();
  ChunkedBuffer buffer = MakeChunkedBuffer(TestLengths(), kGap, dtype, 24);
  const std::vector<unsigned char> before = buffer.data;
  absl::StatusOr<GradStats> reference =
      ComputeGradStatsCpu(PiecesIn(buffer, before.data(), dtype, kGap), nullptr);
  ASSERT_TRUE(reference.ok());
  std::vector<double> partials(buffer.chunks.size());
  ASSERT_TRUE(ConvertWithGradStatsCpu(buffer.data.data(), dtype, buffer.data.data(), dtype,
                                      buffer.chunks, partials.data(), nullptr)
                  .ok());
  EXPECT_EQ(Bits(CombineGradStatsCpu(partials).sum_squares), Bits(reference->sum_squares));
  EXPECT_EQ(buffer.data, before);
}

TEST(ConvertWithGradStatsTest, RefusesBadArguments) {
  std::vector<float> src(8, 1.0f), dst(8);
  double partial = 0.0;
  const std::vector<GradStatsChunk> one = {GradStatsChunk{0, 8}};
  auto code = [&](const void* s, numerics::DType sd, void* d, numerics::DType dd,
                  absl::Span<const GradStatsChunk> chunks, double* partials) {
    return ConvertWithGradStatsCpu(s, sd, d, dd, chunks, partials, nullptr).code();
  };
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(src.data(), static_cast<numerics::DType>(7), dst.data(), numerics::DType::kFloat32,
                 one, &partial),
            kInvalid);
  EXPECT_EQ(code(src.data(), numerics::DType::kFloat32, dst.data(), static_cast<numerics::DType>(7),
                 one, &partial),
            kInvalid);
  EXPECT_EQ(code(src.data(), numerics::DType::kFloat32, dst.data(), numerics::DType::kFloat32, one,
                 nullptr),
            kInvalid);
  EXPECT_EQ(code(nullptr, numerics::DType::kFloat32, dst.data(), numerics::DType::kFloat32, one,
                 &partial),
            kInvalid);
  EXPECT_EQ(code(src.data(), numerics::DType::kFloat32, nullptr, numerics::DType::kFloat32, one,
                 &partial),
            kInvalid);
  EXPECT_EQ(code(src.data(), numerics::DType::kFloat32, src.data(), numerics::DType::kBFloat16, one,
                 &partial),
            kInvalid);
  EXPECT_EQ(code(src.data(), numerics::DType::kFloat32, dst.data(), numerics::DType::kFloat32,
                 {GradStatsChunk{-1, 4}}, &partial),
            kInvalid);
  EXPECT_EQ(code(src.data(), numerics::DType::kFloat32, dst.data(), numerics::DType::kFloat32,
                 {GradStatsChunk{0, kCpuChunkElements + 1}}, &partial),
            kInvalid);
  // Nothing to do is fine, whatever the pointers.
  EXPECT_EQ(
      code(nullptr, numerics::DType::kFloat32, nullptr, numerics::DType::kFloat16, {}, nullptr),
      absl::StatusCode::kOk);
  EXPECT_EQ(CombineGradStatsCpu({}).sum_squares, 0.0);
  EXPECT_FALSE(CombineGradStatsCpu({}).non_finite);
}

}  // namespace
}  // namespace zeroshard::kernels
