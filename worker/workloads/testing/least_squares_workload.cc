// LeastSquaresWorkload: synthetic features from workloads::CounterRng, the analytic gradient.
#include "worker/workloads/testing/least_squares_workload.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/workloads/counter_rng.h"

namespace zeroshard::workloads::testing {
namespace {

// What a CounterRng stream of the workload holds (the `role` of its stream id).
enum class LeastSquaresRole : uint64_t { kInitial = 0, kTeacher = 1, kFeatures = 2 };

uint64_t LeastSquaresStream(LeastSquaresRole role, uint64_t number) {
  return (static_cast<uint64_t>(role) << 32) | number;
}

}  // namespace

LeastSquaresWorkload::LeastSquaresWorkload(std::vector<sharding::TensorSpec> tensors,
                                           int64_t global_batch, int64_t rank, int64_t world_size,
                                           uint64_t seed)
    : tensors_(std::move(tensors)),
      global_batch_(global_batch),
      rank_(rank),
      world_size_(world_size),
      seed_(seed) {
  for (const sharding::TensorSpec& spec : tensors_) {
    offsets_.push_back(total_elements_);
    total_elements_ += spec.num_elements;
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(total_elements_));
  const CounterRng teacher_rng(seed_, LeastSquaresStream(LeastSquaresRole::kTeacher, 0));
  for (size_t t = 0; t < tensors_.size(); ++t) {
    std::vector<float> teacher(tensors_[t].num_elements);
    teacher_rng.FillSymmetricUniform(offsets_[t], 2.0f * bound, absl::MakeSpan(teacher));
    teacher_.push_back(std::move(teacher));
  }
}

absl::Status LeastSquaresWorkload::InitialParameters(int64_t tensor, absl::Span<float> out) const {
  if (tensor < 0 || tensor >= static_cast<int64_t>(tensors_.size()) ||
      static_cast<int64_t>(out.size()) != tensors_[tensor].num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": bad index or size"));
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(total_elements_));
  const CounterRng rng(seed_, LeastSquaresStream(LeastSquaresRole::kInitial, 0));
  rng.FillSymmetricUniform(offsets_[tensor], bound, out);
  return absl::OkStatus();
}

double LeastSquaresWorkload::LossAndGradients(
    int64_t step, int64_t sample_begin, int64_t sample_end,
    absl::FunctionRef<absl::Span<const float>(int64_t)> params,
    std::vector<std::vector<float>>* gradients) const {
  const int64_t num_tensors = static_cast<int64_t>(tensors_.size());
  const CounterRng feature_rng(
      seed_, LeastSquaresStream(LeastSquaresRole::kFeatures, static_cast<uint64_t>(step)));
  std::vector<std::vector<double>> sums(num_tensors);
  for (int64_t t = 0; t < num_tensors; ++t) sums[t].assign(tensors_[t].num_elements, 0.0);
  // One sample's features, every tensor's end to end: drawn once, read by both passes.
  std::vector<float> features(total_elements_);
  double loss_sum = 0.0;
  for (int64_t i = sample_begin; i < sample_end; ++i) {
    feature_rng.FillSymmetricUniform(static_cast<uint64_t>(i) * total_elements_, 1.0f,
                                     absl::MakeSpan(features));
    double residual = 0.0;
    for (int64_t t = 0; t < num_tensors; ++t) {
      absl::Span<const float> w = params(t);
      const float* x = features.data() + offsets_[t];
      for (int64_t j = 0; j < tensors_[t].num_elements; ++j) {
        residual += (static_cast<double>(w[j]) - teacher_[t][j]) * x[j];
      }
    }
    loss_sum += 0.5 * residual * residual;
    for (int64_t t = 0; t < num_tensors; ++t) {
      const float* x = features.data() + offsets_[t];
      for (int64_t j = 0; j < tensors_[t].num_elements; ++j) sums[t][j] += residual * x[j];
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

double LeastSquaresWorkload::ExpectedLoss(
    absl::FunctionRef<absl::Span<const float>(int64_t)> params) const {
  double squared_distance = 0.0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    absl::Span<const float> w = params(static_cast<int64_t>(t));
    for (size_t j = 0; j < teacher_[t].size(); ++j) {
      const double difference = static_cast<double>(w[j]) - teacher_[t][j];
      squared_distance += difference * difference;
    }
  }
  return squared_distance / 6.0;
}

absl::StatusOr<double> LeastSquaresWorkload::ForwardBackward(int64_t step, ParameterSource& params,
                                                             GradientSink& sink) {
  const int64_t local_batch = global_batch_ / world_size_;
  // Every tensor is widened (exactly) into widened_ and released at once: the loss reads all of
  // them together, and a zero3 engine holds only a few tensors' full values at a time (a test
  // workload: small tensors).
  std::vector<absl::Span<const float>> values(tensors_.size());
  widened_.resize(tensors_.size());
  // Forward order, the tensor list backwards (the order an engine gathers them in).
  for (size_t t = tensors_.size(); t-- > 0;) {
    ZS_ASSIGN_OR_RETURN(const StoredParameters stored, params.Parameters(static_cast<int64_t>(t)));
    if (stored.size != tensors_[t].num_elements || !numerics::IsValidDType(stored.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("params: tensor ", t, " has ", stored.size, " elements of dtype ",
                       static_cast<int>(stored.dtype), ", expected ", tensors_[t].num_elements));
    }
    widened_[t].resize(stored.size);
    WidenParameters(stored, 0, stored.size, widened_[t].data());
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(static_cast<int64_t>(t)));
    values[t] = widened_[t];
  }
  const double loss = LossAndGradients(
      step, rank_ * local_batch, (rank_ + 1) * local_batch, [&](int64_t t) { return values[t]; },
      &gradients_);
  if (step == infinity_step_) gradients_[0][0] = std::numeric_limits<float>::infinity();
  // Backward of the scaled loss: the gradients times the loss scale, in float.
  const float scale = static_cast<float>(sink.loss_scale());
  for (size_t t = 0; t < tensors_.size(); ++t) {
    for (float& value : gradients_[t]) value *= scale;
    ZS_RETURN_IF_ERROR(CopyGradientToSink(sink, static_cast<int64_t>(t), gradients_[t]));
  }
  return loss;
}

int64_t LeastSquaresWorkload::BufferBytes() const {
  int64_t teacher_floats = 0;
  for (const std::vector<float>& teacher : teacher_) teacher_floats += teacher.capacity();
  // The gradients ForwardBackward keeps (fp32), the widened parameters (fp32), and
  // LossAndGradients' fp64 sums and fp32 features, each one element per model element.
  const int64_t per_step =
      total_elements_ * int64_t{sizeof(float) + sizeof(float) + sizeof(double) + sizeof(float)};
  return teacher_floats * int64_t{sizeof(float)} + per_step;
}

}  // namespace zeroshard::workloads::testing
