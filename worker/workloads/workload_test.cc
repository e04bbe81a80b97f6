// Tests of the workload seam's helpers: WidenParameters widens every dtype exactly from any
// offset, and CopyGradientToSink hands a gradient over segment by segment.
#include "worker/workloads/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "numerics/dtype.h"

namespace zeroshard::workloads {
namespace {

using numerics::DType;

// Values that exercise each dtype: normals, a subnormal of fp16 (2^-20), signed zero, infinities.
std::vector<float> SampleValues() {
  return {1.0f,
          -2.5f,
          0.333333f,
          65504.0f,
          std::ldexp(1.0f, -20),
          -0.0f,
          1e-3f,
          -7.125e-5f,
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()};
}

TEST(WidenParametersTest, WidensEveryDtypeExactlyFromAnyOffset) {
  const std::vector<float> values = SampleValues();
  const int64_t size = static_cast<int64_t>(values.size());
  std::vector<uint16_t> bf16;
  std::vector<uint16_t> fp16;
  for (float value : values) {
    bf16.push_back(numerics::FloatToBFloat16(value));
    fp16.push_back(numerics::FloatToHalf(value));
  }
  for (int64_t begin : {0, 3}) {
    const int64_t count = size - begin - 1;
    std::vector<float> out(count, std::nanf(""));
    WidenParameters({values.data(), DType::kFloat32, size}, begin, count, out.data());
    for (int64_t k = 0; k < count; ++k) EXPECT_EQ(out[k], values[begin + k]) << k;
    WidenParameters({bf16.data(), DType::kBFloat16, size}, begin, count, out.data());
    for (int64_t k = 0; k < count; ++k) {
      EXPECT_EQ(out[k], numerics::BFloat16ToFloat(bf16[begin + k])) << k;
    }
    WidenParameters({fp16.data(), DType::kFloat16, size}, begin, count, out.data());
    for (int64_t k = 0; k < count; ++k) {
      EXPECT_EQ(out[k], numerics::HalfToFloat(fp16[begin + k])) << k;
    }
  }
  // fp16 keeps its subnormal 2^-20 exactly; bf16 rounds 0.333333 to 8 significant bits.
  std::vector<float> one(1);
  WidenParameters({fp16.data(), DType::kFloat16, size}, 4, 1, one.data());
  EXPECT_EQ(one[0], std::ldexp(1.0f, -20));
  WidenParameters({bf16.data(), DType::kBFloat16, size}, 2, 1, one.data());
  EXPECT_NE(one[0], values[2]);
  EXPECT_NEAR(one[0], values[2], values[2] / 256);
}

// A sink whose segments are 3 elements long, recording what was written where.
class ThreeElementSink : public GradientSink {
 public:
  explicit ThreeElementSink(int64_t size) : written(size, std::nanf("")) {}
  double loss_scale() const override { return 1.0; }
  int64_t GradSegmentEnd(int64_t, int64_t begin) const override {
    return std::min<int64_t>(begin + 3, written.size());
  }
  absl::StatusOr<absl::Span<float>> GradBuffer(int64_t, int64_t begin, int64_t end) override {
    return absl::MakeSpan(written).subspan(begin, end - begin);
  }
  absl::Status GradWritten(int64_t, int64_t begin, int64_t end) override {
    segments.push_back({begin, end});
    return absl::OkStatus();
  }
  std::vector<float> written;
  std::vector<std::pair<int64_t, int64_t>> segments;
};

TEST(CopyGradientToSinkTest, CopiesSegmentBySegment) {
  const std::vector<float> gradient = {1, 2, 3, 4, 5, 6, 7, 8};
  ThreeElementSink sink(static_cast<int64_t>(gradient.size()));
  ASSERT_TRUE(CopyGradientToSink(sink, 0, gradient).ok());
  EXPECT_EQ(sink.written, gradient);
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 3}, {3, 6}, {6, 8}};
  EXPECT_EQ(sink.segments, expected);
  // A sink whose segments run past the gradient is refused.
  ThreeElementSink longer(20);
  EXPECT_EQ(CopyGradientToSink(longer, 0, gradient).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zeroshard::workloads
