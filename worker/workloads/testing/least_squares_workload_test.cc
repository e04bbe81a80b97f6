// Tests of the least-squares test workload: its features are the documented CounterRng stream,
// its gradient is the loss's, the ranks split the batch, its expected loss is the batch loss's
// mean, bf16/fp16 parameters act as their widened values, and the injected overflow lands where
// asked.
#include "worker/workloads/testing/least_squares_workload.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "numerics/dtype.h"
#include "sharding/tensor_spec.h"
#include "worker/workloads/counter_rng.h"

namespace zeroshard::workloads::testing {
namespace {

constexpr uint64_t kSeed = 11;

using Tensors = std::vector<std::vector<float>>;

std::vector<sharding::TensorSpec> TensorsOfSizes(const std::vector<int64_t>& sizes) {
  std::vector<sharding::TensorSpec> tensors;
  for (int64_t size : sizes) {
    sharding::TensorSpec spec;
    spec.name = "t" + std::to_string(tensors.size());
    spec.shape = {size};
    spec.num_elements = size;
    tensors.push_back(spec);
  }
  return tensors;
}

Tensors InitialParameters(const LeastSquaresWorkload& workload,
                          const std::vector<sharding::TensorSpec>& tensors) {
  Tensors params;
  for (size_t t = 0; t < tensors.size(); ++t) {
    params.emplace_back(tensors[t].num_elements);
    EXPECT_TRUE(
        workload.InitialParameters(static_cast<int64_t>(t), absl::MakeSpan(params.back())).ok());
  }
  return params;
}

// Parameters held per tensor, as fp32 values or rounded to bf16/fp16 bits.
class VectorParameterSource : public ParameterSource {
 public:
  explicit VectorParameterSource(Tensors tensors, numerics::DType dtype = numerics::DType::kFloat32)
      : tensors_(std::move(tensors)), dtype_(dtype) {
    for (const std::vector<float>& tensor : tensors_) {
      std::vector<uint16_t> bits;
      for (float value : tensor) {
        bits.push_back(dtype == numerics::DType::kFloat16 ? numerics::FloatToHalf(value)
                                                          : numerics::FloatToBFloat16(value));
      }
      bits_.push_back(std::move(bits));
    }
  }
  absl::StatusOr<StoredParameters> Parameters(int64_t tensor) override {
    const int64_t size = static_cast<int64_t>(tensors_[tensor].size());
    if (dtype_ == numerics::DType::kFloat32) {
      return StoredParameters{tensors_[tensor].data(), dtype_, size};
    }
    return StoredParameters{bits_[tensor].data(), dtype_, size};
  }

 private:
  Tensors tensors_;
  const numerics::DType dtype_;
  std::vector<std::vector<uint16_t>> bits_;
};

// Keeps the last gradient of every tensor, taken whole (one segment per tensor).
class RecordingSink : public GradientSink {
 public:
  explicit RecordingSink(const std::vector<sharding::TensorSpec>& tensors) {
    for (const sharding::TensorSpec& tensor : tensors) gradients.emplace_back(tensor.num_elements);
  }
  double loss_scale() const override { return 1.0; }
  int64_t GradSegmentEnd(int64_t tensor, int64_t) const override {
    return static_cast<int64_t>(gradients[tensor].size());
  }
  absl::StatusOr<absl::Span<float>> GradBuffer(int64_t tensor, int64_t begin,
                                               int64_t end) override {
    return absl::MakeSpan(gradients[tensor]).subspan(begin, end - begin);
  }
  absl::Status GradWritten(int64_t, int64_t, int64_t) override { return absl::OkStatus(); }
  Tensors gradients;
};

TEST(LeastSquaresWorkloadTest, FeaturesAreTheCounterRngStreamOfTheStep) {
  // One sample, so the gradient is residual * x: x is the stream up to one common factor.
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({3, 4});
  const LeastSquaresWorkload workload(tensors, /*global_batch=*/8, /*rank=*/0, /*world_size=*/1,
                                      kSeed);
  const Tensors params = InitialParameters(workload, tensors);
  constexpr int64_t kStep = 5;
  constexpr int64_t kSample = 2;
  Tensors gradients;
  const double loss = workload.LossAndGradients(
      kStep, kSample, kSample + 1, [&](int64_t t) { return absl::MakeConstSpan(params[t]); },
      &gradients);
  const CounterRng stream(kSeed, (uint64_t{2} << 32) | kStep);
  const int64_t total_elements = 7;
  const double x0 = stream.SymmetricUniform(kSample * total_elements);
  const double residual = gradients[0][0] / x0;
  EXPECT_NEAR(std::fabs(residual), std::sqrt(2.0 * loss), 1e-6 * std::fabs(residual));
  int64_t index = kSample * total_elements;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (float gradient : gradients[t]) {
      const double x = stream.SymmetricUniform(index++);
      EXPECT_NEAR(gradient, residual * x, 1e-6 * std::fabs(residual)) << "tensor " << t;
    }
  }
}

TEST(LeastSquaresWorkloadTest, GradientMatchesCentralDifferencesOfTheLoss) {
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({5, 1, 9});
  const LeastSquaresWorkload workload(tensors, /*global_batch=*/6, /*rank=*/0, /*world_size=*/1,
                                      kSeed);
  Tensors params = InitialParameters(workload, tensors);
  auto loss_at = [&](Tensors* gradients) {
    return workload.LossAndGradients(
        /*step=*/1, 0, 6, [&](int64_t t) { return absl::MakeConstSpan(params[t]); }, gradients);
  };
  Tensors gradients, unused;
  loss_at(&gradients);
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t j = 0; j < params[t].size(); ++j) {
      const float original = params[t][j];
      // The loss is quadratic, so a central difference is exact up to rounding.
      params[t][j] = original + 1e-2f;
      const double plus = loss_at(&unused);
      const float step_up = params[t][j] - original;
      params[t][j] = original - 1e-2f;
      const double minus = loss_at(&unused);
      const float step_down = original - params[t][j];
      params[t][j] = original;
      const double difference = (plus - minus) / (static_cast<double>(step_up) + step_down);
      EXPECT_NEAR(gradients[t][j], difference, 1e-5 * std::fabs(difference) + 1e-9)
          << "tensor " << t << ", element " << j;
    }
  }
}

TEST(LeastSquaresWorkloadTest, RanksSplitTheGlobalBatch) {
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({6, 10});
  constexpr int64_t kGlobalBatch = 12;
  constexpr int64_t kWorldSize = 3;
  constexpr int64_t kStep = 4;
  const LeastSquaresWorkload whole(tensors, kGlobalBatch, 0, 1, kSeed);
  const Tensors initial = InitialParameters(whole, tensors);
  Tensors whole_gradients;
  const double whole_loss = whole.LossAndGradients(
      kStep, 0, kGlobalBatch, [&](int64_t t) { return absl::MakeConstSpan(initial[t]); },
      &whole_gradients);
  double loss_sum = 0.0;
  Tensors gradient_sums = whole_gradients;
  for (std::vector<float>& sum : gradient_sums) sum.assign(sum.size(), 0.0f);
  for (int64_t rank = 0; rank < kWorldSize; ++rank) {
    LeastSquaresWorkload workload(tensors, kGlobalBatch, rank, kWorldSize, kSeed);
    EXPECT_EQ(InitialParameters(workload, tensors), initial) << "rank " << rank;
    VectorParameterSource params(initial);
    RecordingSink sink(tensors);
    auto loss = workload.ForwardBackward(kStep, params, sink);
    ASSERT_TRUE(loss.ok()) << loss.status();
    loss_sum += *loss;
    ASSERT_EQ(sink.gradients.size(), tensors.size());
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (size_t j = 0; j < gradient_sums[t].size(); ++j) {
        gradient_sums[t][j] += sink.gradients[t][j];
      }
    }
  }
  // Equal micro-batches: the whole batch's mean is the mean of the ranks' means.
  EXPECT_NEAR(loss_sum / kWorldSize, whole_loss, 1e-12 * whole_loss);
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t j = 0; j < gradient_sums[t].size(); ++j) {
      EXPECT_NEAR(gradient_sums[t][j] / kWorldSize, whole_gradients[t][j],
                  1e-6 * std::fabs(whole_gradients[t][j]) + 1e-9);
    }
  }
}

TEST(LeastSquaresWorkloadTest, ExpectedLossIsTheMeanOfBatchLosses) {
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({40, 24});
  const LeastSquaresWorkload workload(tensors, /*global_batch=*/1, 0, 1, kSeed);
  const Tensors params = InitialParameters(workload, tensors);
  auto source = [&](int64_t t) { return absl::MakeConstSpan(params[t]); };
  // 0.5 * residual^2 has a relative standard deviation of sqrt(2) per sample, so over 8000
  // samples the mean is within 1.6% (one standard deviation) of its expectation; allow 10%.
  constexpr int64_t kSamples = 8000;
  Tensors unused;
  const double mean = workload.LossAndGradients(/*step=*/0, 0, kSamples, source, &unused);
  const double expected = workload.ExpectedLoss(source);
  EXPECT_GT(expected, 0.0);
  EXPECT_NEAR(mean, expected, 0.1 * expected);
}

TEST(LeastSquaresWorkloadTest, InitialParametersStayWithinTheirBoundAndCheckTheirArguments) {
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({30, 70});
  const LeastSquaresWorkload workload(tensors, 4, 0, 1, kSeed);
  const Tensors params = InitialParameters(workload, tensors);
  const float bound = 1.0f / std::sqrt(100.0f);
  for (const std::vector<float>& tensor : params) {
    for (float value : tensor) {
      EXPECT_GE(value, -bound);
      EXPECT_LT(value, bound);
    }
  }
  EXPECT_NE(params[0][0], params[0][1]);
  std::vector<float> wrong_size(29);
  EXPECT_EQ(workload.InitialParameters(0, absl::MakeSpan(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> right_size(30);
  EXPECT_EQ(workload.InitialParameters(2, absl::MakeSpan(right_size)).code(),
            absl::StatusCode::kInvalidArgument);
}

// bf16/fp16 parameters act as their exactly widened values: the loss and gradients are those of
// fp32 parameters holding the rounded values, bit for bit. A wrong size is refused.
TEST(LeastSquaresWorkloadTest, LowPrecisionParametersActAsTheirWidenedValues) {
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({13, 5});
  LeastSquaresWorkload workload(tensors, 4, 0, 1, kSeed);
  const Tensors initial = InitialParameters(workload, tensors);
  for (numerics::DType dtype : {numerics::DType::kBFloat16, numerics::DType::kFloat16}) {
    SCOPED_TRACE(numerics::DTypeName(dtype));
    Tensors rounded = initial;
    for (std::vector<float>& tensor : rounded) {
      for (float& value : tensor) {
        value = dtype == numerics::DType::kFloat16
                    ? numerics::HalfToFloat(numerics::FloatToHalf(value))
                    : numerics::BFloat16ToFloat(numerics::FloatToBFloat16(value));
      }
    }
    ASSERT_NE(rounded, initial);
    VectorParameterSource low(initial, dtype);
    VectorParameterSource widened(rounded);
    RecordingSink low_sink(tensors);
    RecordingSink widened_sink(tensors);
    const absl::StatusOr<double> low_loss = workload.ForwardBackward(2, low, low_sink);
    const absl::StatusOr<double> widened_loss = workload.ForwardBackward(2, widened, widened_sink);
    ASSERT_TRUE(low_loss.ok()) << low_loss.status();
    ASSERT_TRUE(widened_loss.ok()) << widened_loss.status();
    EXPECT_EQ(*low_loss, *widened_loss);
    EXPECT_EQ(low_sink.gradients, widened_sink.gradients);
  }
  Tensors short_tensor = initial;
  short_tensor[1].pop_back();
  VectorParameterSource bad(short_tensor);
  RecordingSink sink(tensors);
  EXPECT_EQ(workload.ForwardBackward(0, bad, sink).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LeastSquaresWorkloadTest, InjectedInfinityLandsOnlyAtItsStep) {
  const std::vector<sharding::TensorSpec> tensors = TensorsOfSizes({3, 2});
  LeastSquaresWorkload workload(tensors, 2, 0, 1, kSeed);
  workload.InjectInfinityAtStep(1);
  VectorParameterSource params(InitialParameters(workload, tensors));
  for (int64_t step = 0; step < 3; ++step) {
    RecordingSink sink(tensors);
    ASSERT_TRUE(workload.ForwardBackward(step, params, sink).ok());
    EXPECT_EQ(std::isinf(sink.gradients[0][0]), step == 1) << "step " << step;
    EXPECT_TRUE(std::isfinite(sink.gradients[0][1])) << "step " << step;
    EXPECT_TRUE(std::isfinite(sink.gradients[1][0])) << "step " << step;
  }
}

}  // namespace
}  // namespace zeroshard::workloads::testing
