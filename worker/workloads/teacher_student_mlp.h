// The teacher-student MLP workload (docs/design.md, "Workloads"): a student MLP learns, with MSE
// loss, the function of a fixed random teacher MLP of the same shape on synthetic uniform inputs.
// Forward and backward by hand over single-threaded OpenBLAS sgemm, from parameters in their
// stored dtype (bf16/fp16 weights widened a tile at a time). docs/workloads.md specifies the data
// and the initial weights exactly.
#ifndef ZEROSHARD_WORKER_WORKLOADS_TEACHER_STUDENT_MLP_H_
#define ZEROSHARD_WORKER_WORKLOADS_TEACHER_STUDENT_MLP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/tensor_spec.h"
#include "worker/workloads/workload.h"

namespace zeroshard::workloads {

// Which random parameters a generator stream belongs to. A stream id is (role << 32) | number,
// where the inputs use number 0 and Linear layer l (forward order, 0-based) uses number 2l for
// its weight and 2l + 1 for its bias.
enum class MlpRole : uint64_t { kInputs = 0, kStudent = 1, kTeacher = 2 };
uint64_t MlpStream(MlpRole role, uint64_t number);

// Bounds beyond the catalog's (sharding/model_catalog.h).
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxDatasetSize = int64_t{1} << 40;

// The fp32 scratch a bf16/fp16 weight is widened into, in elements (256 KiB): OpenBLAS 0.3.21 has
// no bf16 GEMM, so the CPU MLP converts whole rows of a weight, as many as fit (at least one), and
// runs sgemm on them. It is the only fp32 copy of low-precision parameters the workload holds.
inline constexpr int64_t kWeightTileElems = int64_t{1} << 16;

// Rows of a weight with `in_size` columns and `out_size` rows widened at a time:
// kWeightTileElems / in_size, clamped to [1, out_size].
int64_t WeightTileRows(int64_t in_size, int64_t out_size);

// The initial value of Linear layer `layer`'s weight ([out, in], row-major) or bias ([out]) of
// the student or the teacher (role kStudent or kTeacher): uniform in +-InitBound(in) like torch's
// default Linear init. `sizes` are validated layer sizes; `out` has the tensor's element count.
absl::Status FillLayerParameters(MlpRole role, absl::Span<const int64_t> sizes, uint64_t seed,
                                 int64_t layer, bool bias, absl::Span<float> out);

// The input of dataset sample `sample`: sizes[0] values uniform in [-1, 1), element k being
// value sample * sizes[0] + k of the inputs stream.
void FillSampleInput(absl::Span<const int64_t> sizes, uint64_t seed, int64_t sample,
                     absl::Span<float> out);

struct TeacherStudentMlpOptions {
  std::vector<int64_t> layer_sizes;  // [s0, ..., sn], validated by the catalog
  uint64_t seed = 0;
  int64_t global_batch = 128;  // samples per step over all ranks; a multiple of world_size
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t dataset_size = 1024;  // distinct samples; the data repeats after it
};

// Checks everything but layer_sizes (the catalog checks those): InvalidArgument naming the field
// when world_size < 1, rank is outside [0, world_size), global_batch is outside
// [1, kMaxGlobalBatch] or not a multiple of world_size, or dataset_size is outside
// [1, kMaxDatasetSize]. Shared by the CPU and CUDA workloads.
absl::Status ValidateTeacherStudentMlpOptions(const TeacherStudentMlpOptions& options);

// The dataset index of sample j (0 <= j < global_batch / world_size) of `options.rank`'s
// micro-batch at `step`: (step * global_batch + rank * local_batch + j) mod dataset_size, computed
// without overflow. Shared by the CPU and CUDA workloads.
int64_t MlpSampleIndex(const TeacherStudentMlpOptions& options, int64_t step, int64_t j);

// params.Parameters(tensor) (which waits for the tensor's all-gathers), checked against the
// catalog's `tensors`: InvalidArgument naming the tensor when its size is not the catalog's or
// its dtype is invalid. Shared by the CPU and CUDA workloads.
// REQUIRES: 0 <= tensor < tensors.size().
absl::StatusOr<StoredParameters> CheckedMlpParameters(
    ParameterSource& params, absl::Span<const sharding::TensorSpec> tensors, int64_t tensor);

// The student's initial values of catalog tensor `tensor` (<2l>.bias / .weight in
// gradient-ready order). InvalidArgument naming `tensor` when it is not one of the model's.
absl::Status FillStudentInitialParameters(const TeacherStudentMlpOptions& options, int64_t tensor,
                                          absl::Span<float> out);

// Step s's global batch is the samples (s * global_batch + j) mod dataset_size, j in
// [0, global_batch); rank r takes j in [r * B / W, (r + 1) * B / W). A sample's input is a pure
// function of (seed, sample), whatever W is; its target is teacher(input) in fp32.
//
// The student's parameters are the catalog's tensors, in its order (gradient-ready):
// <2(n-1)>.bias, <2(n-1)>.weight, ..., 0.bias, 0.weight (torch nn.Sequential names).
// The loss is the mean of the squared error over the micro-batch and the outputs (torch's
// MSELoss), and the gradients handed to the sink are those of that mean.
//
// Parameters are read in their stored dtype (workload.h), each layer's just before the layer's
// forward (after the micro-batch and its targets), in forward order. fp32 ones are used in place. A
// bf16 or fp16 weight is widened to fp32 WeightTileRows rows at a time into one scratch tile, for
// the forward product (out = in W^T + b, a column block of `out` per tile) and for backward's
// delta_prev = delta W (a sum over tiles); a low-precision bias is widened whole (one layer's
// width). Activations, the loss gradient and every gradient stay fp32.
//
// Thread contract: not thread-safe; one ForwardBackward at a time. It allocates nothing:
// every buffer is sized at Create. The teacher's weights stay in memory (as many elements as
// the student's, fp32).
class TeacherStudentMlp final : public Workload {
 public:
  // Errors are InvalidArgument naming the field: invalid layer_sizes (the catalog's checks),
  // global_batch outside [1, kMaxGlobalBatch] or not a multiple of world_size, world_size < 1,
  // rank outside [0, world_size), dataset_size outside [1, kMaxDatasetSize].
  static absl::StatusOr<std::unique_ptr<TeacherStudentMlp>> Create(
      const TeacherStudentMlpOptions& options);

  absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const override;
  absl::StatusOr<double> ForwardBackward(int64_t step, ParameterSource& params,
                                         GradientSink& sink) override;
  // Every buffer below (host memory); ForwardBackward allocates nothing more.
  int64_t BufferBytes() const override;

  const std::vector<sharding::TensorSpec>& tensors() const { return tensors_; }
  int64_t local_batch() const { return local_batch_; }
  // The dataset index of sample j (0 <= j < local_batch) of this rank's micro-batch at `step`.
  int64_t SampleIndex(int64_t step, int64_t j) const;

 private:
  TeacherStudentMlp(TeacherStudentMlpOptions options, std::vector<sharding::TensorSpec> tensors);

  // Catalog tensor index of layer `layer`'s bias (its weight is the next index).
  int64_t BiasTensor(int64_t layer) const;
  // Fills inputs_ and targets_ with this rank's micro-batch of `step`.
  void LoadMicroBatch(int64_t step);
  // Rows [first_row, first_row + rows) of layer `layer`'s weight gradient into `out` (row-major,
  // the layer's input size per row), from the layer's output gradient `delta`.
  void WeightGradientRows(int64_t layer, const float* delta, int64_t first_row, int64_t rows,
                          float* out) const;
  // Layer `layer`'s weight gradient into `sink`, segment by segment.
  absl::Status WeightGradient(int64_t layer, const float* delta, GradientSink& sink);
  // out = in W^T + b for the student's layer `layer` (no activation), from its stored parameters.
  void StudentLinearForward(int64_t layer, const float* in, float* out);
  // previous = delta W for the student's layer `layer` (before ReLU's derivative).
  void StudentInputGradient(int64_t layer, const float* delta, float* previous);

  const TeacherStudentMlpOptions options_;
  const std::vector<sharding::TensorSpec> tensors_;
  const int64_t num_layers_;   // Linear layers
  const int64_t local_batch_;  // global_batch / world_size
  // Teacher weight and bias of each Linear layer, forward order.
  std::vector<std::vector<float>> teacher_weights_;
  std::vector<std::vector<float>> teacher_biases_;
  // activations_[l] is [local_batch, sizes[l]]: activations_[0] the inputs, activations_[l] for
  // 0 < l < n the ReLU outputs, activations_[n] the student's outputs.
  std::vector<std::vector<float>> activations_;
  std::vector<float> targets_;             // [local_batch, sizes[n]]
  std::vector<float> teacher_scratch_[2];  // [local_batch, max size]: teacher forward ping-pong
  std::vector<float> delta_[2];            // [local_batch, max size]: dLoss/d(pre-activation)
  std::vector<float> row_grad_;            // one weight row (the largest layer's input size)
  // A bf16/fp16 weight's rows widened to fp32: WeightTileRows rows of the widest layer's tile.
  std::vector<float> weight_tile_;
  std::vector<float> widened_bias_;  // a bf16/fp16 bias widened (the largest layer's size)
  // The current step's student parameters by Linear layer (from the ParameterSource).
  std::vector<StoredParameters> student_weights_;
  std::vector<StoredParameters> student_biases_;
};

}  // namespace zeroshard::workloads

#endif  // ZEROSHARD_WORKER_WORKLOADS_TEACHER_STUDENT_MLP_H_
