// A test workload with an analytic gradient: linear least squares on synthetic data, used to
// check the engine's modes against each other and against a single-process reference.
#ifndef ZEROSHARD_WORKER_ENGINE_LEAST_SQUARES_WORKLOAD_H_
#define ZEROSHARD_WORKER_ENGINE_LEAST_SQUARES_WORKLOAD_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/tensor_spec.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {

// Sample i of step s has one feature vector x_t per tensor t (uniform in [-1, 1], from a
// counter-based hash of (seed, s, i, t, j)). The model predicts y_hat = sum_t <w_t, x_t>; the
// target is the same sum with a fixed teacher's weights; the loss is mean_i 0.5 (y_hat - y)^2,
// so dloss/dw_t = mean_i (y_hat_i - y_i) x_t,i (accumulated in double, rounded to float).
//
// Thread contract: const methods are thread-safe; ForwardBackward is called by one thread.
class LeastSquaresWorkload : public workloads::Workload {
 public:
  LeastSquaresWorkload(std::vector<sharding::TensorSpec> tensors, int64_t global_batch,
                       int64_t rank, int64_t world_size, uint64_t seed);

  // Uniform in +-1/sqrt(total elements), from the seed.
  absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const override;

  // This rank's global_batch / world_size consecutive samples.
  absl::StatusOr<double> ForwardBackward(int64_t step, workloads::ParameterSource& params,
                                         workloads::GradientSink& sink) override;

  // The mean loss over samples [sample_begin, sample_end) of step `step` at parameters
  // `params(t)`, and its gradient per tensor in `gradients` (resized as needed).
  double LossAndGradients(int64_t step, int64_t sample_begin, int64_t sample_end,
                          absl::FunctionRef<absl::Span<const float>(int64_t)> params,
                          std::vector<std::vector<float>>* gradients) const;

  // At step `step`, the gradient this rank hands over has element 0 of tensor 0 set to +Inf
  // (an overflow for the engine to detect and skip). -1 turns it off.
  void InjectInfinityAtStep(int64_t step) { infinity_step_ = step; }

  int64_t global_batch() const { return global_batch_; }

 private:
  float Feature(int64_t step, int64_t sample, int64_t tensor, int64_t element) const;

  const std::vector<sharding::TensorSpec> tensors_;
  const int64_t global_batch_;
  const int64_t rank_;
  const int64_t world_size_;
  const uint64_t seed_;
  int64_t total_elements_ = 0;
  std::vector<std::vector<float>> teacher_;    // teacher_[t]: the target weights of tensor t
  std::vector<std::vector<float>> gradients_;  // scratch of ForwardBackward
  int64_t infinity_step_ = -1;
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_LEAST_SQUARES_WORKLOAD_H_
