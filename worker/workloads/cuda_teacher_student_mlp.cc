// CudaTeacherStudentMlp: the teacher-student MLP's forward and backward on the GPU. cuBLAS does
// the matrix products, cuda_mlp_kernels.cu the element work. CUDA errors become absl::Status
// through common/cuda_status.h, cuBLAS errors through CublasStatus below.
//
// Row-major over column-major cuBLAS: a row-major matrix M [r, c] is, in memory, the
// column-major matrix M^T [c, r] with leading dimension c. So each row-major product
// C = op(A) op(B) is computed as cuBLAS's column-major C^T = op(B)^T op(A)^T, that is with the
// operands swapped: cublasSgemm(.., m = C's columns, n = C's rows, .., B, .., A, .., C, ldc =
// C's columns). The three products, with x [batch, in], W [out, in], d [batch, out]:
//   forward      y [batch, out] = x W^T   ->  y^T = W x^T     : (T, N), m=out, n=batch, k=in
//   weight grad  G [out, in]    = d^T x   ->  G^T = x^T d     : (N, T), m=in,  n=out,   k=batch
//   input grad   p [batch, in]  = d W     ->  p^T = W^T d^T   : (N, N), m=in,  n=batch, k=out
// With a bf16/fp16 weight, the forward and input-grad products are cublasGemmEx calls of the
// same shapes, x or d rounded to the weight's dtype first, fp32 accumulation and output.
#include "worker/workloads/cuda_teacher_student_mlp.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "numerics/dtype.h"
#include "sharding/model_catalog.h"
#include "worker/workloads/cuda_mlp_kernels.h"
#include "worker/workloads/row_blocks.h"

namespace zeroshard::workloads {
namespace {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": cuBLAS error ", static_cast<int>(status), ": ",
                                           cublasGetStatusString(status));
  return status == CUBLAS_STATUS_ALLOC_FAILED ? absl::ResourceExhaustedError(message)
                                              : absl::InternalError(message);
}

#define ZS_CUBLAS_RETURN_IF_ERROR(expr) ZS_RETURN_IF_ERROR(CublasStatus((expr), #expr))

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
cublasHandle_t AsHandle(void* handle) { return static_cast<cublasHandle_t>(handle); }

// cuBLAS's name for a 16-bit parameter dtype.
cudaDataType_t LowPrecisionType(numerics::DType dtype) {
  return dtype == numerics::DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTeacherStudentMlp>> CudaTeacherStudentMlp::Create(
    const TeacherStudentMlpOptions& options, void* stream) {
  ZS_ASSIGN_OR_RETURN(std::vector<sharding::TensorSpec> tensors,
                      sharding::TensorsForLayerSizes(options.layer_sizes));
  ZS_RETURN_IF_ERROR(ValidateTeacherStudentMlpOptions(options));
  std::unique_ptr<CudaTeacherStudentMlp> workload(
      new CudaTeacherStudentMlp(options, std::move(tensors), stream));
  ZS_RETURN_IF_ERROR(workload->Initialize());
  return workload;
}

CudaTeacherStudentMlp::CudaTeacherStudentMlp(TeacherStudentMlpOptions options,
                                             std::vector<sharding::TensorSpec> tensors,
                                             void* stream)
    : options_(std::move(options)),
      tensors_(std::move(tensors)),
      num_layers_(static_cast<int64_t>(options_.layer_sizes.size()) - 1),
      local_batch_(options_.global_batch / options_.world_size),
      stream_(stream) {}

CudaTeacherStudentMlp::~CudaTeacherStudentMlp() {
  // Errors are not actionable here: the stream's work is abandoned either way.
  cudaStreamSynchronize(AsStream(stream_));
  if (cublas_ != nullptr) cublasDestroy(AsHandle(cublas_));
  for (void* allocation : allocations_) cudaFree(allocation);
}

template <class T>
absl::StatusOr<T*> CudaTeacherStudentMlp::AllocateDevice(int64_t count) {
  void* data = nullptr;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
  ZS_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, bytes));
  allocations_.push_back(data);
  device_bytes_ += static_cast<int64_t>(bytes);
  ZS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, bytes, AsStream(stream_)));
  return static_cast<T*>(data);
}

absl::Status CudaTeacherStudentMlp::Initialize() {
  cublasHandle_t handle = nullptr;
  ZS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  cublas_ = handle;
  ZS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, AsStream(stream_)));
  // Plain fp32 products (no TF32 tensor-op math), scalars passed from the host.
  ZS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  ZS_CUBLAS_RETURN_IF_ERROR(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));

  const std::vector<int64_t>& sizes = options_.layer_sizes;
  const int64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  std::vector<float> host;
  for (int64_t l = 0; l < num_layers_; ++l) {
    const int64_t in = sizes[l];
    const int64_t out = sizes[l + 1];
    for (const bool bias : {false, true}) {
      host.assign(bias ? out : in * out, 0.0f);
      ZS_RETURN_IF_ERROR(FillLayerParameters(MlpRole::kTeacher, sizes, options_.seed, l, bias,
                                             absl::MakeSpan(host)));
      ZS_ASSIGN_OR_RETURN(float* device, AllocateDevice<float>(host.size()));
      // Synchronous: `host` is refilled for the next array.
      ZS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float),
                                              cudaMemcpyHostToDevice, AsStream(stream_)));
      ZS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream_)));
      (bias ? teacher_biases_ : teacher_weights_).push_back(device);
    }
  }
  for (int64_t size : sizes) {
    ZS_ASSIGN_OR_RETURN(float* activation, AllocateDevice<float>(local_batch_ * size));
    activations_.push_back(activation);
  }
  ZS_ASSIGN_OR_RETURN(targets_, AllocateDevice<float>(local_batch_ * sizes.back()));
  for (int k = 0; k < 2; ++k) {
    ZS_ASSIGN_OR_RETURN(teacher_scratch_[k], AllocateDevice<float>(local_batch_ * max_size));
    ZS_ASSIGN_OR_RETURN(delta_[k], AllocateDevice<float>(local_batch_ * max_size));
  }
  ZS_ASSIGN_OR_RETURN(row_grad_, AllocateDevice<float>(max_size));
  ZS_ASSIGN_OR_RETURN(bias_grad_, AllocateDevice<float>(max_size));
  ZS_ASSIGN_OR_RETURN(low_precision_operand_, AllocateDevice<uint16_t>(local_batch_ * max_size));
  ZS_ASSIGN_OR_RETURN(loss_partials_, AllocateDevice<double>(cuda_internal::kLossBlocks));
  ZS_ASSIGN_OR_RETURN(loss_sum_, AllocateDevice<double>(1));
  host_inputs_.resize(local_batch_ * sizes[0]);
  ZS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream_)));
  return absl::OkStatus();
}

int64_t CudaTeacherStudentMlp::BufferBytes() const {
  return device_bytes_ + static_cast<int64_t>(host_inputs_.capacity() * sizeof(float));
}

int64_t CudaTeacherStudentMlp::SampleIndex(int64_t step, int64_t j) const {
  return MlpSampleIndex(options_, step, j);
}

absl::Status CudaTeacherStudentMlp::InitialParameters(int64_t tensor, absl::Span<float> out) const {
  return FillStudentInitialParameters(options_, tensor, out);
}

absl::Status CudaTeacherStudentMlp::RoundOperand(const float* values, int64_t count,
                                                 numerics::DType dtype) {
  return common::CudaStatus(
      cuda_internal::LaunchRoundToLowPrecision(values, count, static_cast<int32_t>(dtype),
                                               low_precision_operand_, AsStream(stream_)),
      "rounding kernel");
}

absl::Status CudaTeacherStudentMlp::LinearForward(const float* in, const StoredParameters& weight,
                                                  const StoredParameters& bias, int64_t in_size,
                                                  int64_t out_size, bool relu, float* out) {
  const float one = 1.0f;
  const float zero = 0.0f;
  // y^T [out, batch] = W [out, in] x^T [in, batch] (see the top of this file).
  if (weight.dtype == numerics::DType::kFloat32) {
    ZS_CUBLAS_RETURN_IF_ERROR(
        cublasSgemm(AsHandle(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_size),
                    static_cast<int>(local_batch_), static_cast<int>(in_size), &one,
                    static_cast<const float*>(weight.data), static_cast<int>(in_size), in,
                    static_cast<int>(in_size), &zero, out, static_cast<int>(out_size)));
  } else {
    ZS_RETURN_IF_ERROR(RoundOperand(in, local_batch_ * in_size, weight.dtype));
    const cudaDataType_t type = LowPrecisionType(weight.dtype);
    ZS_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
        AsHandle(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_size),
        static_cast<int>(local_batch_), static_cast<int>(in_size), &one, weight.data, type,
        static_cast<int>(in_size), low_precision_operand_, type, static_cast<int>(in_size), &zero,
        out, CUDA_R_32F, static_cast<int>(out_size), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return common::CudaStatus(
      cuda_internal::LaunchBiasActivation(out, bias.data, static_cast<int32_t>(bias.dtype),
                                          local_batch_, out_size, relu, AsStream(stream_)),
      "bias and activation kernel");
}

absl::Status CudaTeacherStudentMlp::InputGradient(const float* delta,
                                                  const StoredParameters& weight, int64_t in_size,
                                                  int64_t out_size, float* previous) {
  const float one = 1.0f;
  const float zero = 0.0f;
  // p^T [in, batch] = W^T [in, out] d^T [out, batch] (see the top of this file).
  if (weight.dtype == numerics::DType::kFloat32) {
    ZS_CUBLAS_RETURN_IF_ERROR(
        cublasSgemm(AsHandle(cublas_), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(in_size),
                    static_cast<int>(local_batch_), static_cast<int>(out_size), &one,
                    static_cast<const float*>(weight.data), static_cast<int>(in_size), delta,
                    static_cast<int>(out_size), &zero, previous, static_cast<int>(in_size)));
    return absl::OkStatus();
  }
  ZS_RETURN_IF_ERROR(RoundOperand(delta, local_batch_ * out_size, weight.dtype));
  const cudaDataType_t type = LowPrecisionType(weight.dtype);
  ZS_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      AsHandle(cublas_), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(in_size),
      static_cast<int>(local_batch_), static_cast<int>(out_size), &one, weight.data, type,
      static_cast<int>(in_size), low_precision_operand_, type, static_cast<int>(out_size), &zero,
      previous, CUDA_R_32F, static_cast<int>(in_size), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaTeacherStudentMlp::LoadMicroBatch(int64_t step) {
  const std::vector<int64_t>& sizes = options_.layer_sizes;
  const int64_t in_size = sizes[0];
  for (int64_t j = 0; j < local_batch_; ++j) {
    FillSampleInput(sizes, options_.seed, SampleIndex(step, j),
                    absl::MakeSpan(host_inputs_.data() + j * in_size, in_size));
  }
  // Queued after the previous step's reads of the inputs; synchronous, so host_inputs_ may be
  // refilled next step.
  ZS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(activations_[0], host_inputs_.data(),
                                          host_inputs_.size() * sizeof(float),
                                          cudaMemcpyHostToDevice, AsStream(stream_)));
  ZS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream_)));
  const float* in = activations_[0];
  for (int64_t l = 0; l < num_layers_; ++l) {
    const bool last = l + 1 == num_layers_;
    float* out = last ? targets_ : teacher_scratch_[l % 2];
    const StoredParameters weight{teacher_weights_[l], numerics::DType::kFloat32,
                                  sizes[l] * sizes[l + 1]};
    const StoredParameters bias{teacher_biases_[l], numerics::DType::kFloat32, sizes[l + 1]};
    ZS_RETURN_IF_ERROR(
        LinearForward(in, weight, bias, sizes[l], sizes[l + 1], /*relu=*/!last, out));
    in = out;
  }
  return absl::OkStatus();
}

absl::Status CudaTeacherStudentMlp::WeightGradientRows(int64_t layer, const float* delta,
                                                       int64_t first_row, int64_t rows,
                                                       float* out) {
  // Rows [first_row, first_row + rows) of G [out, in] (row-major) are columns of G^T [in, out]
  // (column-major): G^T[:, rows] = x^T [in, batch] d[:, rows] (see the top of this file).
  const int64_t in_size = options_.layer_sizes[layer];
  const int64_t out_size = options_.layer_sizes[layer + 1];
  const float one = 1.0f;
  const float zero = 0.0f;
  ZS_CUBLAS_RETURN_IF_ERROR(
      cublasSgemm(AsHandle(cublas_), CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(in_size),
                  static_cast<int>(rows), static_cast<int>(local_batch_), &one, activations_[layer],
                  static_cast<int>(in_size), delta + first_row, static_cast<int>(out_size), &zero,
                  out, static_cast<int>(in_size)));
  return absl::OkStatus();
}

absl::Status CudaTeacherStudentMlp::WeightGradient(int64_t layer, const float* delta,
                                                   GradientSink& sink) {
  const int64_t tensor = BiasTensor(layer) + 1;
  const int64_t in_size = options_.layer_sizes[layer];
  const int64_t elements = tensors_[tensor].num_elements;
  return ForEachGradSegment(
      sink, tensor, elements, [&](int64_t begin, int64_t end, absl::Span<float> out) {
        // A row cut by a segment boundary is computed whole into row_grad_ and copied in parts
        // (on the device); every other row is computed straight into the segment's buffer.
        return ForEachRowBlock(
            begin, end, in_size,
            [&](int64_t row, int64_t from, int64_t to, int64_t offset) -> absl::Status {
              ZS_RETURN_IF_ERROR(WeightGradientRows(layer, delta, row, 1, row_grad_));
              ZS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                  out.data() + offset, row_grad_ + (from - row * in_size),
                  (to - from) * sizeof(float), cudaMemcpyDeviceToDevice, AsStream(stream_)));
              return absl::OkStatus();
            },
            [&](int64_t first_row, int64_t rows, int64_t offset) {
              return WeightGradientRows(layer, delta, first_row, rows, out.data() + offset);
            });
      });
}

absl::StatusOr<double> CudaTeacherStudentMlp::ForwardBackward(int64_t step, ParameterSource& params,
                                                              GradientSink& sink) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step: negative, ", step));
  const std::vector<int64_t>& sizes = options_.layer_sizes;
  std::vector<StoredParameters> weights(num_layers_);
  std::vector<StoredParameters> biases(num_layers_);
  // The inputs and the teacher's targets need no student parameters: queued first, while the
  // engine may still be gathering those.
  ZS_RETURN_IF_ERROR(LoadMicroBatch(step));
  for (int64_t l = 0; l < num_layers_; ++l) {
    // Asked for just before the layer, in forward order: the compute stream then waits only for
    // the all-gathers of this layer's buckets (ParameterSource).
    ZS_ASSIGN_OR_RETURN(weights[l], CheckedMlpParameters(params, tensors_, BiasTensor(l) + 1));
    ZS_ASSIGN_OR_RETURN(biases[l], CheckedMlpParameters(params, tensors_, BiasTensor(l)));
    ZS_RETURN_IF_ERROR(LinearForward(activations_[l], weights[l], biases[l], sizes[l], sizes[l + 1],
                                     /*relu=*/l + 1 < num_layers_, activations_[l + 1]));
    // Done with the layer's parameters until its backward: a zero3 engine may gather the next
    // layers into their buffer, ordered after the kernels queued so far.
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(BiasTensor(l) + 1));
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(BiasTensor(l)));
  }

  // MSE over the micro-batch and the outputs; dLoss/dOutput = 2 (output - target) / count, times
  // the loss scale (backward runs on the scaled loss gradient; exact for power-of-two scales).
  const int64_t count = local_batch_ * sizes.back();
  const float gradient_scale =
      static_cast<float>(2.0 / static_cast<double>(count)) * static_cast<float>(sink.loss_scale());
  float* delta = delta_[0];
  ZS_RETURN_IF_ERROR(common::CudaStatus(
      cuda_internal::LaunchMseLossAndGradient(activations_[num_layers_], targets_, count,
                                              gradient_scale, delta, loss_partials_, loss_sum_,
                                              AsStream(stream_)),
      "MSE kernels"));

  for (int64_t l = num_layers_ - 1; l >= 0; --l) {
    const int64_t in_size = sizes[l];
    const int64_t out_size = sizes[l + 1];
    // The bias gradient is one layer's width: computed whole, then copied into its segments.
    ZS_RETURN_IF_ERROR(
        common::CudaStatus(cuda_internal::LaunchBiasGradient(delta, local_batch_, out_size,
                                                             bias_grad_, AsStream(stream_)),
                           "bias gradient kernel"));
    ZS_RETURN_IF_ERROR(ForEachGradSegment(
        sink, BiasTensor(l), out_size,
        [&](int64_t begin, int64_t end, absl::Span<float> out) -> absl::Status {
          ZS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), bias_grad_ + begin,
                                                  (end - begin) * sizeof(float),
                                                  cudaMemcpyDeviceToDevice, AsStream(stream_)));
          return absl::OkStatus();
        }));
    ZS_RETURN_IF_ERROR(WeightGradient(l, delta, sink));

    if (l == 0) break;
    // p = d W, then ReLU's derivative.
    float* previous = delta_[(num_layers_ - l) % 2];
    // Forward released the weight: asked for again (zero3 gathers it anew).
    ZS_ASSIGN_OR_RETURN(weights[l], CheckedMlpParameters(params, tensors_, BiasTensor(l) + 1));
    ZS_RETURN_IF_ERROR(InputGradient(delta, weights[l], in_size, out_size, previous));
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(BiasTensor(l) + 1));
    ZS_RETURN_IF_ERROR(common::CudaStatus(
        cuda_internal::LaunchReluBackward(previous, activations_[l], local_batch_ * in_size,
                                          AsStream(stream_)),
        "ReLU backward kernel"));
    delta = previous;
  }

  double loss_sum = 0.0;
  ZS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&loss_sum, loss_sum_, sizeof(loss_sum),
                                          cudaMemcpyDeviceToHost, AsStream(stream_)));
  ZS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream_)));
  return loss_sum / static_cast<double>(count);
}

}  // namespace zeroshard::workloads
