// HostDeviceOps' statistics on the move of reduced gradients against the two passes they replace
// (ConvertElements, then ComputeGradStats): the same bits written, the same sums, NaN and Inf.
#include "worker/engine/device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "numerics/dtype.h"
#include "worker/engine/element_convert.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// A reduced bucket's owned piece as the engine sees it: fragments of `lengths` with two-element
// alignment gaps before each, in `dtype`; chunks cut every fragment from its start.
struct ReducedPiece {
  std::vector<char> data;
  std::vector<kernels::GradStatsChunk> chunks;
  std::vector<std::pair<int64_t, int64_t>> fragments;  // (begin, length)
  int64_t elements = 0;
};

ReducedPiece MakePiece(const std::vector<int64_t>& lengths, DType dtype, int64_t chunk_elems,
                       uint32_t seed) {
  ReducedPiece piece;
  for (int64_t length : lengths) {
    const int64_t begin = piece.elements + 2;
    piece.fragments.push_back({begin, length});
    for (int64_t offset = 0; offset < length; offset += chunk_elems) {
      piece.chunks.push_back({begin + offset, std::min(chunk_elems, length - offset)});
    }
    piece.elements = begin + length;
  }
  std::vector<float> values(piece.elements);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  for (float& value : values) value = uniform(rng);
  piece.data.resize(piece.elements * numerics::DTypeSize(dtype));
  ConvertElements(values.data(), DType::kFloat32, piece.data.data(), dtype, piece.elements);
  return piece;
}

void SetElement(ReducedPiece& piece, DType dtype, int64_t i, float value) {
  ConvertElements(&value, DType::kFloat32, piece.data.data() + i * numerics::DTypeSize(dtype),
                  dtype, 1);
}

struct Outcome {
  std::vector<char> moved;  // the destination's bytes inside the fragments
  double totals[2] = {0.0, 0.0};
};

// The fused op over the piece, into a destination of `dst_dtype`.
Outcome Fused(HostDeviceOps& device, const ReducedPiece& piece, DType src_dtype, DType dst_dtype) {
  Outcome outcome;
  const int size = numerics::DTypeSize(dst_dtype);
  std::vector<char> dst(piece.elements * size);
  std::vector<double> partials(piece.chunks.size());
  EXPECT_TRUE(device
                  .ConvertWithGradStats(piece.data.data(), src_dtype, dst.data(), dst_dtype,
                                        piece.chunks.data(),
                                        static_cast<int64_t>(piece.chunks.size()), partials.data())
                  .ok());
  EXPECT_TRUE(
      device
          .CombineGradStats(partials.data(), static_cast<int64_t>(partials.size()), outcome.totals)
          .ok());
  for (const auto& [begin, length] : piece.fragments) {
    outcome.moved.insert(outcome.moved.end(), dst.begin() + begin * size,
                         dst.begin() + (begin + length) * size);
  }
  return outcome;
}

// The two passes the fused op replaces: the conversion, then the statistics of the fragments.
Outcome Unfused(HostDeviceOps& device, const ReducedPiece& piece, DType src_dtype,
                DType dst_dtype) {
  Outcome outcome;
  const int size = numerics::DTypeSize(dst_dtype);
  std::vector<char> dst(piece.elements * size);
  EXPECT_TRUE(
      device.ConvertElements(piece.data.data(), src_dtype, dst.data(), dst_dtype, piece.elements)
          .ok());
  std::vector<kernels::GradPiece> pieces;
  for (const auto& [begin, length] : piece.fragments) {
    pieces.push_back({dst.data() + begin * size, dst_dtype, length});
    outcome.moved.insert(outcome.moved.end(), dst.begin() + begin * size,
                         dst.begin() + (begin + length) * size);
  }
  const absl::StatusOr<kernels::GradStats> stats = device.ComputeGradStats(pieces);
  EXPECT_TRUE(stats.ok());
  if (stats.ok()) {
    outcome.totals[0] = stats->sum_squares;
    outcome.totals[1] = stats->non_finite ? 1.0 : 0.0;
  }
  return outcome;
}

TEST(HostDeviceOpsTest, StatisticsOnTheMoveEqualTheSeparatePass) {
  HostDeviceOps device(/*threads=*/2);
  const int64_t chunk = device.GradStatsChunkElements();
  // Odd lengths, a vector and a bit, and a fragment of more than two chunks.
  const std::vector<int64_t> lengths = {1, 17, 999, 2 * chunk + 3, 0, 40};
  for (DType src : kDTypes) {
    for (DType dst : kDTypes) {
      SCOPED_TRACE(absl::StrCat(numerics::DTypeName(src), " to ", numerics::DTypeName(dst)));
      const ReducedPiece piece = MakePiece(lengths, src, chunk, 5);
      const Outcome fused = Fused(device, piece, src, dst);
      const Outcome unfused = Unfused(device, piece, src, dst);
      EXPECT_EQ(fused.moved, unfused.moved);
      EXPECT_EQ(Bits(fused.totals[0]), Bits(unfused.totals[0]));
      EXPECT_EQ(fused.totals[1], 0.0);
      EXPECT_EQ(unfused.totals[1], 0.0);
    }
  }
}

TEST(HostDeviceOpsTest, StatisticsOnTheMoveFindNaNAndInfinity) {
  HostDeviceOps device(/*threads=*/1);
  const int64_t chunk = device.GradStatsChunkElements();
  const std::vector<int64_t> lengths = {33, chunk + 9};
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (DType src : kDTypes) {
    for (DType dst : kDTypes) {
      ReducedPiece piece = MakePiece(lengths, src, chunk, 6);
      // The first fragment's tail, and the second fragment's second chunk.
      for (int64_t position : {int64_t{2 + 32}, int64_t{2 + 33 + 2 + chunk + 4}}) {
        for (float special : specials) {
          SCOPED_TRACE(absl::StrCat(numerics::DTypeName(src), " to ", numerics::DTypeName(dst),
                                    ", ", special, " at ", position));
          ReducedPiece poisoned = piece;
          SetElement(poisoned, src, position, special);
          const Outcome fused = Fused(device, poisoned, src, dst);
          const Outcome unfused = Unfused(device, poisoned, src, dst);
          EXPECT_EQ(fused.totals[1], 1.0);
          EXPECT_EQ(unfused.totals[1], 1.0);
          EXPECT_FALSE(std::isfinite(fused.totals[0]));
        }
      }
    }
  }
}

TEST(HostDeviceOpsTest, StatisticsInPlaceLeaveTheValues) {
  HostDeviceOps device(/*threads=*/1);
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(numerics::DTypeName(dtype));
    ReducedPiece piece = MakePiece({5, 70000, 12}, dtype, device.GradStatsChunkElements(), 7);
    const std::vector<char> before = piece.data;
    std::vector<double> partials(piece.chunks.size());
    ASSERT_TRUE(device
                    .ConvertWithGradStats(
                        piece.data.data(), dtype, piece.data.data(), dtype, piece.chunks.data(),
                        static_cast<int64_t>(piece.chunks.size()), partials.data())
                    .ok());
    double totals[2];
    ASSERT_TRUE(device.CombineGradStats(partials.data(), partials.size(), totals).ok());
    EXPECT_EQ(piece.data, before);
    EXPECT_EQ(Bits(totals[0]), Bits(Unfused(device, piece, dtype, dtype).totals[0]));
  }
}

TEST(HostDeviceOpsTest, StatisticsRefuseBadArguments) {
  HostDeviceOps device(/*threads=*/1);
  float values[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const kernels::GradStatsChunk chunk{0, 4};
  double partial = 0.0;
  double totals[2];
  EXPECT_EQ(device
                .ConvertWithGradStats(values, DType::kFloat32, values, DType::kFloat32, &chunk, -1,
                                      &partial)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device
                .ConvertWithGradStats(values, DType::kFloat32, values, DType::kFloat16, &chunk, 1,
                                      &partial)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device.CombineGradStats(&partial, -1, totals).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(device.CombineGradStats(nullptr, 0, totals).ok());
  EXPECT_EQ(totals[0], 0.0);
  EXPECT_EQ(totals[1], 0.0);
}

}  // namespace
}  // namespace zeroshard::engine
