// A test workload with an analytic gradient: linear least squares on synthetic data, used to
// check the engine's modes against each other and against a single-process reference.
#ifndef ZEROSHARD_WORKER_WORKLOADS_TESTING_LEAST_SQUARES_WORKLOAD_H_
#define ZEROSHARD_WORKER_WORKLOADS_TESTING_LEAST_SQUARES_WORKLOAD_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/tensor_spec.h"
#include "worker/workloads/workload.h"

namespace zeroshard::workloads::testing {

// Every value is drawn from a workloads::CounterRng stream (uniform in [-1, 1), then scaled);
// stream ids are (role << 32) | number as for the MLP (docs/workloads.md), with roles initial 0,
// teacher 1, features 2. With E the total element count and o_t the offset of tensor t when the
// tensors are laid end to end:
// - sample i of step s has one feature vector x_t per tensor t, element j being value
//   i * E + o_t + j of stream (2 << 32) | s;
// - element j of tensor t is value o_t + j of stream 0 (initial weights, scaled by 1/sqrt(E)) or
//   of stream 1 << 32 (the teacher's weights, scaled by 2/sqrt(E)).
// The model predicts y_hat = sum_t <w_t, x_t>; the target is the same sum with the teacher's
// weights; the loss is mean_i 0.5 (y_hat - y)^2, so dloss/dw_t = mean_i (y_hat_i - y_i) x_t,i
// (accumulated in double, rounded to float).
//
// Thread contract: const methods are thread-safe; ForwardBackward and InjectInfinityAtStep are
// called by one thread.
class LeastSquaresWorkload : public Workload {
 public:
  LeastSquaresWorkload(std::vector<sharding::TensorSpec> tensors, int64_t global_batch,
                       int64_t rank, int64_t world_size, uint64_t seed);

  // Uniform in +-1/sqrt(total elements), from the seed.
  absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const override;

  // This rank's global_batch / world_size consecutive samples, at the parameters widened to
  // fp32. InvalidArgument when a tensor of `params` has the wrong size or an invalid dtype.
  absl::StatusOr<double> ForwardBackward(int64_t step, ParameterSource& params,
                                         GradientSink& sink) override;

  // The teacher and the gradients ForwardBackward keeps (4 bytes per element each) plus what
  // LossAndGradients allocates during a step (fp64 sums and one sample's features: 12 bytes per
  // element).
  int64_t BufferBytes() const override;

  // The mean loss over samples [sample_begin, sample_end) of step `step` at parameters
  // `params(t)`, and its gradient per tensor in `gradients` (resized as needed).
  double LossAndGradients(int64_t step, int64_t sample_begin, int64_t sample_end,
                          absl::FunctionRef<absl::Span<const float>(int64_t)> params,
                          std::vector<std::vector<float>>* gradients) const;

  // The loss's expectation over the features at parameters `params(t)`, free of the sampling
  // noise of any batch's loss: features are independent with mean 0 and variance 1/3 (up to
  // their 2^-23 grid), so it is (1/6) sum_t ||w_t - teacher_t||^2.
  double ExpectedLoss(absl::FunctionRef<absl::Span<const float>(int64_t)> params) const;

  // At step `step`, the gradient this rank hands over has element 0 of tensor 0 set to +Inf
  // (an overflow for the engine to detect and skip). -1 turns it off.
  void InjectInfinityAtStep(int64_t step) { infinity_step_ = step; }

  int64_t global_batch() const { return global_batch_; }

 private:
  const std::vector<sharding::TensorSpec> tensors_;
  const int64_t global_batch_;
  const int64_t rank_;
  const int64_t world_size_;
  const uint64_t seed_;
  std::vector<int64_t> offsets_;  // offsets_[t]: o_t, tensor t's first element end to end
  int64_t total_elements_ = 0;
  std::vector<std::vector<float>> teacher_;    // teacher_[t]: the target weights of tensor t
  std::vector<std::vector<float>> gradients_;  // scratch of ForwardBackward
  std::vector<std::vector<float>> widened_;    // bf16/fp16 parameters widened by ForwardBackward
  int64_t infinity_step_ = -1;
};

}  // namespace zeroshard::workloads::testing

#endif  // ZEROSHARD_WORKER_WORKLOADS_TESTING_LEAST_SQUARES_WORKLOAD_H_
