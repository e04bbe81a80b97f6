// Internal to CudaTeacherStudentMlp: launchers of its small element kernels (bias and ReLU, the
// MSE loss and its gradient, the bias gradient, ReLU's backward, the rounding of a product's
// operand to bf16/fp16), compiled by nvcc in cuda_mlp_kernels.cu. Matrices are row-major
// [batch, features], as in teacher_student_mlp.h. Dtypes are numerics::DType values.
#ifndef ZEROSHARD_WORKER_WORKLOADS_CUDA_MLP_KERNELS_H_
#define ZEROSHARD_WORKER_WORKLOADS_CUDA_MLP_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zeroshard::workloads::cuda_internal {

// Blocks of the loss's first reduction stage: a constant, so the summation order (and the bits)
// do not depend on the device. `partials` of the loss launcher hold this many doubles.
inline constexpr int kLossBlocks = 256;

// Each launcher enqueues on `stream` and returns the launch error, if any.

// out[j, o] = out[j, o] + bias[o], then max(., 0) when `relu` (x > 0 ? x : 0, as the CPU does).
// `bias` holds `bias_dtype` elements (fp32, or bf16/fp16 bits widened exactly).
cudaError_t LaunchBiasActivation(float* out, const void* bias, int32_t bias_dtype, int64_t batch,
                                 int64_t out_size, bool relu, cudaStream_t stream);

// diff = outputs[k] - targets[k]; delta[k] = diff * gradient_scale; *loss_sum = sum over k of
// double(diff)^2, in two fixed-order stages (kLossBlocks partial sums into `partials`, then one
// block adds them in a fixed tree): deterministic, no atomics.
cudaError_t LaunchMseLossAndGradient(const float* outputs, const float* targets, int64_t count,
                                     float gradient_scale, float* delta, double* partials,
                                     double* loss_sum, cudaStream_t stream);

// bias_grad[o] = sum over j, in order, of delta[j, o] (fp32, as the CPU loop adds).
cudaError_t LaunchBiasGradient(const float* delta, int64_t batch, int64_t out_size,
                               float* bias_grad, cudaStream_t stream);

// delta[k] = 0 where !(activation[k] > 0) (ReLU's derivative at the layer's output).
cudaError_t LaunchReluBackward(float* delta, const float* activation, int64_t count,
                               cudaStream_t stream);

// dst[k] = the bits of src[k] rounded to `dtype` (bf16 or fp16, nearest even, as
// numerics/dtype.h), for k < count: an fp32 operand of a cublasGemmEx with 16-bit inputs.
cudaError_t LaunchRoundToLowPrecision(const float* src, int64_t count, int32_t dtype, uint16_t* dst,
                                      cudaStream_t stream);

}  // namespace zeroshard::workloads::cuda_internal

#endif  // ZEROSHARD_WORKER_WORKLOADS_CUDA_MLP_KERNELS_H_
