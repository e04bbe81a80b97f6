// The teacher-student MLP of teacher_student_mlp.h on a CUDA GPU: the same data, initial weights,
// loss and gradients, with cuBLAS for the matrix products (sgemm, or cublasGemmEx in bf16/fp16
// with fp32 accumulation for low-precision parameters) and small CUDA kernels for the rest.
// Built only under --config=cuda; this header has no CUDA includes.
#ifndef ZEROSHARD_WORKER_WORKLOADS_CUDA_TEACHER_STUDENT_MLP_H_
#define ZEROSHARD_WORKER_WORKLOADS_CUDA_TEACHER_STUDENT_MLP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/tensor_spec.h"
#include "worker/workloads/teacher_student_mlp.h"
#include "worker/workloads/workload.h"

namespace zeroshard::workloads {

// The model, batches and gradients are TeacherStudentMlp's (same options, same catalog tensors
// in the same order, same generator). Inputs are generated on the host (FillSampleInput, exact)
// and copied; the teacher's weights are generated on the host once and live on the device; the
// targets are the teacher's forward on the device. Parameters and gradients crossing the seam
// are device pointers on the current device, ordered on `stream` (workload.h, "Memory").
//
// Parameters are read in their stored dtype (workload.h). With fp32 parameters results are close
// to, not bitwise equal to, the CPU workload's: cuBLAS adds the products in its own order (fp32
// throughout, no TF32: the handle uses CUBLAS_DEFAULT_MATH), and the loss is summed in a fixed
// device order. With a bf16/fp16 weight, the forward product and backward's delta W run as
// cublasGemmEx with 16-bit inputs (the weight as stored; the activation or delta rounded to the
// weight's dtype into one [local_batch, largest size] scratch) and CUBLAS_COMPUTE_32F (fp32
// accumulation and fp32 output), as torch's autocast does; the CPU workload keeps that operand in
// fp32 instead, so the two differ by the operand's rounding. Weight gradients, the loss gradient
// and activations stay fp32. For a fixed GPU model and cuBLAS version every step is
// deterministic: no atomics, fixed launch shapes.
//
// Thread contract: not thread-safe; one ForwardBackward at a time, on a thread whose current
// CUDA device is the stream's. Every CUDA and cuBLAS error becomes a Status in one place
// (cuda_teacher_student_mlp.cc): Internal, ResourceExhausted for device memory.
class CudaTeacherStudentMlp final : public Workload {
 public:
  // `stream` is the engine's compute stream (a cudaStream_t) on the current device; the caller
  // keeps it alive. Errors: TeacherStudentMlp::Create's InvalidArgument for bad options; CUDA
  // or cuBLAS failures (e.g. ResourceExhausted when device memory runs out).
  static absl::StatusOr<std::unique_ptr<CudaTeacherStudentMlp>> Create(
      const TeacherStudentMlpOptions& options, void* stream);
  // Waits for the stream, then frees the device buffers and the cuBLAS handle.
  ~CudaTeacherStudentMlp() override;
  CudaTeacherStudentMlp(const CudaTeacherStudentMlp&) = delete;
  CudaTeacherStudentMlp& operator=(const CudaTeacherStudentMlp&) = delete;

  // Host memory, as TeacherStudentMlp's (the same values).
  absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const override;
  // `params` must give device pointers; the gradients handed to `sink` are device pointers.
  // Returns the mean loss (copied to the host, so it waits for the forward pass).
  absl::StatusOr<double> ForwardBackward(int64_t step, ParameterSource& params,
                                         GradientSink& sink) override;
  // The device arrays plus the host staging of the inputs.
  int64_t BufferBytes() const override;

  const std::vector<sharding::TensorSpec>& tensors() const { return tensors_; }
  int64_t local_batch() const { return local_batch_; }

 private:
  CudaTeacherStudentMlp(TeacherStudentMlpOptions options, std::vector<sharding::TensorSpec> tensors,
                        void* stream);
  // Allocates and fills everything; called once by Create.
  absl::Status Initialize();
  // A zero-filled device array of `count` elements of T, freed by the destructor.
  template <class T>
  absl::StatusOr<T*> AllocateDevice(int64_t count);
  // Catalog tensor index of layer `layer`'s bias (its weight is the next index).
  int64_t BiasTensor(int64_t layer) const { return 2 * (num_layers_ - 1 - layer); }
  // The dataset index of sample j of this rank's micro-batch at `step` (as TeacherStudentMlp).
  int64_t SampleIndex(int64_t step, int64_t j) const;
  // out = in * weight^T + bias (then ReLU when `relu`): [batch, out_size] row-major, from
  // parameters in any dtype.
  absl::Status LinearForward(const float* in, const StoredParameters& weight,
                             const StoredParameters& bias, int64_t in_size, int64_t out_size,
                             bool relu, float* out);
  // previous = delta * weight ([batch, in_size]), before ReLU's derivative.
  absl::Status InputGradient(const float* delta, const StoredParameters& weight, int64_t in_size,
                             int64_t out_size, float* previous);
  // `count` fp32 values rounded to `dtype` into low_precision_operand_, for a 16-bit product.
  absl::Status RoundOperand(const float* values, int64_t count, numerics::DType dtype);
  // Copies this rank's inputs of `step` to the device and runs the teacher into targets_.
  absl::Status LoadMicroBatch(int64_t step);
  // Rows [first_row, first_row + rows) of layer `layer`'s weight gradient into `out` (device,
  // row-major, the layer's input size per row), from the layer's output gradient `delta`.
  absl::Status WeightGradientRows(int64_t layer, const float* delta, int64_t first_row,
                                  int64_t rows, float* out);
  // Layer `layer`'s weight gradient into `sink`, segment by segment.
  absl::Status WeightGradient(int64_t layer, const float* delta, GradientSink& sink);

  const TeacherStudentMlpOptions options_;
  const std::vector<sharding::TensorSpec> tensors_;
  const int64_t num_layers_;        // Linear layers
  const int64_t local_batch_;       // global_batch / world_size
  void* const stream_;              // cudaStream_t, not owned
  void* cublas_ = nullptr;          // cublasHandle_t, owned, bound to stream_
  std::vector<void*> allocations_;  // every device array, freed by the destructor
  int64_t device_bytes_ = 0;        // their sizes' sum

  // Device arrays, all sized at Create (the same roles as TeacherStudentMlp's host buffers).
  std::vector<float*> teacher_weights_;  // [out, in] per Linear layer, forward order
  std::vector<float*> teacher_biases_;
  std::vector<float*> activations_;  // [local_batch, sizes[l]]: inputs, ReLU outputs, outputs
  float* targets_ = nullptr;         // [local_batch, sizes[n]]
  float* teacher_scratch_[2] = {};   // [local_batch, max size]
  float* delta_[2] = {};             // [local_batch, max size]
  float* row_grad_ = nullptr;        // one weight row (the largest layer's size)
  float* bias_grad_ = nullptr;       // the largest layer's size
  // [local_batch, max size] bf16/fp16 bits: the activation or delta operand of a product with a
  // low-precision weight.
  uint16_t* low_precision_operand_ = nullptr;
  double* loss_partials_ = nullptr;  // cuda_internal::kLossBlocks
  double* loss_sum_ = nullptr;       // 1
  std::vector<float> host_inputs_;   // [local_batch, sizes[0]] staging for the copy
};

}  // namespace zeroshard::workloads

#endif  // ZEROSHARD_WORKER_WORKLOADS_CUDA_TEACHER_STUDENT_MLP_H_
