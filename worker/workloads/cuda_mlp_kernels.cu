// CudaTeacherStudentMlp's element kernels: grid-stride loops, and the loss's deterministic
// two-stage reduction (a fixed grid and fixed shared-memory trees, no atomics).
#include <cuda_runtime.h>

#include "numerics/dtype.h"
#include "worker/workloads/cuda_mlp_kernels.h"

namespace zeroshard::workloads::cuda_internal {
namespace {

using numerics::DType;

constexpr int kThreadsPerBlock = 256;  // a power of two: the reduction trees halve it
constexpr int64_t kMaxBlocks = 4096;

int BlocksFor(int64_t count) {
  const int64_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ int64_t GridStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ float LoadElement(const void* data, int32_t dtype, int64_t i) {
  if (dtype == static_cast<int32_t>(DType::kFloat32)) return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == static_cast<int32_t>(DType::kBFloat16) ? numerics::BFloat16ToFloat(bits)
                                                         : numerics::HalfToFloat(bits);
}

__global__ void BiasActivationKernel(float* out, const void* bias, int32_t bias_dtype,
                                     int64_t batch, int64_t out_size, bool relu) {
  const int64_t count = batch * out_size;
  for (int64_t k = FirstIndex(); k < count; k += GridStride()) {
    const float value = out[k] + LoadElement(bias, bias_dtype, k % out_size);
    out[k] = relu ? (value > 0.0f ? value : 0.0f) : value;
  }
}

__global__ void RoundToLowPrecisionKernel(const float* src, int64_t count, int32_t dtype,
                                          uint16_t* dst) {
  const bool bf16 = dtype == static_cast<int32_t>(DType::kBFloat16);
  for (int64_t k = FirstIndex(); k < count; k += GridStride()) {
    dst[k] = bf16 ? numerics::FloatToBFloat16(src[k]) : numerics::FloatToHalf(src[k]);
  }
}

// Sums the block's `values` (kThreadsPerBlock doubles in shared memory) in a fixed tree; the
// result is in values[0] for thread 0.
__device__ void BlockTreeSum(double* values) {
  for (int half = kThreadsPerBlock / 2; half > 0; half /= 2) {
    __syncthreads();
    if (threadIdx.x < half) values[threadIdx.x] += values[threadIdx.x + half];
  }
  __syncthreads();
}

// Stage 1: block b's threads each add, in index order, the elements k = b * T + t + i * (B * T);
// the block then adds its threads' sums in a fixed tree into partials[b].
__global__ void MseStageOneKernel(const float* outputs, const float* targets, int64_t count,
                                  float gradient_scale, float* delta, double* partials) {
  __shared__ double sums[kThreadsPerBlock];
  double sum = 0.0;
  for (int64_t k = FirstIndex(); k < count; k += GridStride()) {
    const float diff = outputs[k] - targets[k];
    sum += static_cast<double>(diff) * static_cast<double>(diff);
    delta[k] = diff * gradient_scale;
  }
  sums[threadIdx.x] = sum;
  BlockTreeSum(sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

// Stage 2: one block adds the kLossBlocks partial sums in a fixed order.
__global__ void MseStageTwoKernel(const double* partials, double* loss_sum) {
  __shared__ double sums[kThreadsPerBlock];
  double sum = 0.0;
  for (int b = threadIdx.x; b < kLossBlocks; b += kThreadsPerBlock) sum += partials[b];
  sums[threadIdx.x] = sum;
  BlockTreeSum(sums);
  if (threadIdx.x == 0) *loss_sum = sums[0];
}

__global__ void BiasGradientKernel(const float* delta, int64_t batch, int64_t out_size,
                                   float* bias_grad) {
  for (int64_t o = FirstIndex(); o < out_size; o += GridStride()) {
    float sum = 0.0f;
    for (int64_t j = 0; j < batch; ++j) sum += delta[j * out_size + o];
    bias_grad[o] = sum;
  }
}

__global__ void ReluBackwardKernel(float* delta, const float* activation, int64_t count) {
  for (int64_t k = FirstIndex(); k < count; k += GridStride()) {
    if (!(activation[k] > 0.0f)) delta[k] = 0.0f;
  }
}

}  // namespace

cudaError_t LaunchBiasActivation(float* out, const void* bias, int32_t bias_dtype, int64_t batch,
                                 int64_t out_size, bool relu, cudaStream_t stream) {
  const int64_t count = batch * out_size;
  if (count <= 0) return cudaSuccess;
  BiasActivationKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(out, bias, bias_dtype,
                                                                          batch, out_size, relu);
  return cudaGetLastError();
}

cudaError_t LaunchMseLossAndGradient(const float* outputs, const float* targets, int64_t count,
                                     float gradient_scale, float* delta, double* partials,
                                     double* loss_sum, cudaStream_t stream) {
  MseStageOneKernel<<<kLossBlocks, kThreadsPerBlock, 0, stream>>>(outputs, targets, count,
                                                                  gradient_scale, delta, partials);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  MseStageTwoKernel<<<1, kThreadsPerBlock, 0, stream>>>(partials, loss_sum);
  return cudaGetLastError();
}

cudaError_t LaunchBiasGradient(const float* delta, int64_t batch, int64_t out_size,
                               float* bias_grad, cudaStream_t stream) {
  if (out_size <= 0) return cudaSuccess;
  BiasGradientKernel<<<BlocksFor(out_size), kThreadsPerBlock, 0, stream>>>(delta, batch, out_size,
                                                                           bias_grad);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(float* delta, const float* activation, int64_t count,
                               cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  ReluBackwardKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(delta, activation, count);
  return cudaGetLastError();
}

cudaError_t LaunchRoundToLowPrecision(const float* src, int64_t count, int32_t dtype, uint16_t* dst,
                                      cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  RoundToLowPrecisionKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(src, count, dtype,
                                                                               dst);
  return cudaGetLastError();
}

}  // namespace zeroshard::workloads::cuda_internal
