// LeastSquaresWorkload: synthetic features from a counter-based hash, the analytic gradient.
#include "worker/engine/least_squares_workload.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zeroshard::engine {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) with 24 random bits, from a hash of the four keys.
float UniformFromKeys(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c) ^ d);
  return static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) /
         static_cast<float>(int64_t{1} << 23);
}

constexpr uint64_t kInitialStream = 1;
constexpr uint64_t kTeacherStream = 2;
constexpr uint64_t kFeatureStream = 3;

}  // namespace

LeastSquaresWorkload::LeastSquaresWorkload(std::vector<sharding::TensorSpec> tensors,
                                           int64_t global_batch, int64_t rank, int64_t world_size,
                                           uint64_t seed)
    : tensors_(std::move(tensors)),
      global_batch_(global_batch),
      rank_(rank),
      world_size_(world_size),
      seed_(seed) {
  for (const sharding::TensorSpec& spec : tensors_) total_elements_ += spec.num_elements;
  const float bound = 1.0f / std::sqrt(static_cast<float>(total_elements_));
  for (size_t t = 0; t < tensors_.size(); ++t) {
    std::vector<float> teacher(tensors_[t].num_elements);
    for (size_t j = 0; j < teacher.size(); ++j) {
      teacher[j] = 2.0f * bound * UniformFromKeys(seed_, kTeacherStream, t, j);
    }
    teacher_.push_back(std::move(teacher));
  }
}

float LeastSquaresWorkload::Feature(int64_t step, int64_t sample, int64_t tensor,
                                    int64_t element) const {
  return UniformFromKeys(seed_ ^ (static_cast<uint64_t>(step) << 32), kFeatureStream,
                         (static_cast<uint64_t>(sample) << 20) ^ static_cast<uint64_t>(tensor),
                         element);
}

absl::Status LeastSquaresWorkload::InitialParameters(int64_t tensor, absl::Span<float> out) const {
  if (tensor < 0 || tensor >= static_cast<int64_t>(tensors_.size()) ||
      static_cast<int64_t>(out.size()) != tensors_[tensor].num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": bad index or size"));
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(total_elements_));
  for (size_t j = 0; j < out.size(); ++j) {
    out[j] = bound * UniformFromKeys(seed_, kInitialStream, tensor, j);
  }
  return absl::OkStatus();
}

double LeastSquaresWorkload::LossAndGradients(
    int64_t step, int64_t sample_begin, int64_t sample_end,
    absl::FunctionRef<absl::Span<const float>(int64_t)> params,
    std::vector<std::vector<float>>* gradients) const {
  const int64_t num_tensors = static_cast<int64_t>(tensors_.size());
  std::vector<std::vector<double>> sums(num_tensors);
  for (int64_t t = 0; t < num_tensors; ++t) sums[t].assign(tensors_[t].num_elements, 0.0);
  double loss_sum = 0.0;
  for (int64_t i = sample_begin; i < sample_end; ++i) {
    double residual = 0.0;
    for (int64_t t = 0; t < num_tensors; ++t) {
      absl::Span<const float> w = params(t);
      for (int64_t j = 0; j < tensors_[t].num_elements; ++j) {
        const double x = Feature(step, i, t, j);
        residual += (static_cast<double>(w[j]) - teacher_[t][j]) * x;
      }
    }
    loss_sum += 0.5 * residual * residual;
    for (int64_t t = 0; t < num_tensors; ++t) {
      for (int64_t j = 0; j < tensors_[t].num_elements; ++j) {
        sums[t][j] += residual * Feature(step, i, t, j);
      }
    }
  }
  const double count = static_cast<double>(sample_end - sample_begin);
  gradients->resize(num_tensors);
  for (int64_t t = 0; t < num_tensors; ++t) {
    (*gradients)[t].resize(tensors_[t].num_elements);
    for (int64_t j = 0; j < tensors_[t].num_elements; ++j) {
      (*gradients)[t][j] = static_cast<float>(sums[t][j] / count);
    }
  }
  return loss_sum / count;
}

absl::StatusOr<double> LeastSquaresWorkload::ForwardBackward(int64_t step,
                                                             workloads::ParameterSource& params,
                                                             workloads::GradientSink& sink) {
  const int64_t local_batch = global_batch_ / world_size_;
  const double loss = LossAndGradients(
      step, rank_ * local_batch, (rank_ + 1) * local_batch,
      [&](int64_t t) { return params.Parameters(t); }, &gradients_);
  if (step == infinity_step_) gradients_[0][0] = std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    ZS_RETURN_IF_ERROR(sink.GradReady(static_cast<int64_t>(t), gradients_[t]));
  }
  return loss;
}

}  // namespace zeroshard::engine
