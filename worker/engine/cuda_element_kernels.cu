// The engine's element conversions on a CUDA device: one thread per element (grid-stride), the
// roundings of numerics/dtype.h, so the results are the host loops' bits (element_convert.cc);
// and the gradient statistics summed on the move of reduced gradients, in the kernels' order.
#include <cuda_runtime.h>

#include "kernels/cuda_block_sum.cuh"
#include "numerics/dtype.h"
#include "worker/engine/cuda_element_kernels.h"

namespace zeroshard::engine {
namespace cuda_internal {
namespace {

using numerics::DType;

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 4096;

__device__ float LoadElement(const void* data, int32_t dtype, int64_t i) {
  if (dtype == static_cast<int32_t>(DType::kFloat32)) return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == static_cast<int32_t>(DType::kBFloat16) ? numerics::BFloat16ToFloat(bits)
                                                         : numerics::HalfToFloat(bits);
}

__device__ void StoreElement(void* data, int32_t dtype, int64_t i, float value) {
  if (dtype == static_cast<int32_t>(DType::kFloat32)) {
    static_cast<float*>(data)[i] = value;
  } else if (dtype == static_cast<int32_t>(DType::kBFloat16)) {
    static_cast<uint16_t*>(data)[i] = numerics::FloatToBFloat16(value);
  } else {
    static_cast<uint16_t*>(data)[i] = numerics::FloatToHalf(value);
  }
}

// The value `dtype` storage holds for `value` (rounded to nearest even, widened back).
__device__ float RoundTo(int32_t dtype, float value) {
  if (dtype == static_cast<int32_t>(DType::kBFloat16)) {
    return numerics::BFloat16ToFloat(numerics::FloatToBFloat16(value));
  }
  if (dtype == static_cast<int32_t>(DType::kFloat16)) {
    return numerics::HalfToFloat(numerics::FloatToHalf(value));
  }
  return value;
}

__global__ void StoreScaledGradientKernel(const float* grad, float scale, int64_t count,
                                          int32_t storage_dtype, void* dst, int32_t dst_dtype) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    StoreElement(dst, dst_dtype, i, RoundTo(storage_dtype, grad[i] * scale));
  }
}

__global__ void ConvertElementsKernel(const void* src, int32_t src_dtype, void* dst,
                                      int32_t dst_dtype, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    StoreElement(dst, dst_dtype, i, LoadElement(src, src_dtype, i));
  }
}

__global__ void AddElementsKernel(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                                  int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    StoreElement(dst, dst_dtype, i,
                 LoadElement(dst, dst_dtype, i) + LoadElement(src, src_dtype, i));
  }
}

// Copies element i's bits (equal dtypes) or converts it; returns the value dst now holds.
__device__ float MoveElement(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                             int64_t i) {
  const float value = LoadElement(src, src_dtype, i);
  if (src_dtype == dst_dtype) {
    if (src_dtype == static_cast<int32_t>(DType::kFloat32)) {
      static_cast<uint32_t*>(dst)[i] = static_cast<const uint32_t*>(src)[i];
    } else {
      static_cast<uint16_t*>(dst)[i] = static_cast<const uint16_t*>(src)[i];
    }
    return value;
  }
  const float converted = RoundTo(dst_dtype, value);
  StoreElement(dst, dst_dtype, i, converted);
  return converted;
}

// One block per chunk (grid-stride over chunks): the move and its sum of squares in one pass.
__global__ void __launch_bounds__(kThreadsPerBlock)
    ConvertWithGradStatsKernel(const void* __restrict__ src, int32_t src_dtype, void* dst,
                               int32_t dst_dtype, const DeviceGradStatsChunk* __restrict__ chunks,
                               int64_t num_chunks, double* __restrict__ partials,
                               bool statistics_only) {
  __shared__ double shared[kThreadsPerBlock];
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const DeviceGradStatsChunk chunk = chunks[c];
    const int64_t end = chunk.begin + chunk.length;
    double sum = 0.0;
    for (int64_t i = chunk.begin + threadIdx.x; i < end; i += kThreadsPerBlock) {
      const double x = statistics_only ? LoadElement(src, src_dtype, i)
                                       : MoveElement(src, src_dtype, dst, dst_dtype, i);
      sum = sum + x * x;
    }
    const double chunk_sum = kernels::BlockSum<kThreadsPerBlock>(sum, shared);
    if (threadIdx.x == 0) partials[c] = chunk_sum;
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    CombineGradStatsKernel(const double* __restrict__ partials, int64_t count,
                           double* __restrict__ result) {
  __shared__ double shared[kThreadsPerBlock];
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += kThreadsPerBlock) sum = sum + partials[k];
  const double total = kernels::BlockSum<kThreadsPerBlock>(sum, shared);
  if (threadIdx.x == 0) {
    result[0] = total;
    result[1] = isfinite(total) ? 0.0 : 1.0;
  }
}

int BlocksFor(int64_t count) {
  const int64_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__global__ void MaxAbsKernel(const void* src, int32_t src_dtype, int64_t count,
                             unsigned int* result) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned int largest = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const unsigned int bits = __float_as_uint(fabsf(LoadElement(src, src_dtype, i)));
    if (bits > largest) largest = bits;
  }
  atomicMax(result, largest);
}

}  // namespace

cudaError_t LaunchStoreScaledGradient(const float* grad, float scale, int64_t count,
                                      int32_t storage_dtype, void* dst, int32_t dst_dtype,
                                      cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  StoreScaledGradientKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(
      grad, scale, count, storage_dtype, dst, dst_dtype);
  return cudaGetLastError();
}

cudaError_t LaunchConvertElements(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                                  int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  ConvertElementsKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(src, src_dtype, dst,
                                                                           dst_dtype, count);
  return cudaGetLastError();
}

cudaError_t LaunchAddElements(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                              int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  AddElementsKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(src, src_dtype, dst,
                                                                       dst_dtype, count);
  return cudaGetLastError();
}

cudaError_t LaunchConvertWithGradStats(const void* src, int32_t src_dtype, void* dst,
                                       int32_t dst_dtype, const DeviceGradStatsChunk* chunks,
                                       int64_t num_chunks, double* partials, cudaStream_t stream) {
  if (num_chunks <= 0) return cudaSuccess;
  const int blocks = static_cast<int>(num_chunks < kMaxBlocks ? num_chunks : kMaxBlocks);
  const bool statistics_only = src == dst && src_dtype == dst_dtype;
  ConvertWithGradStatsKernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
      src, src_dtype, dst, dst_dtype, chunks, num_chunks, partials, statistics_only);
  return cudaGetLastError();
}

cudaError_t LaunchCombineGradStats(const double* partials, int64_t count, double* result,
                                   cudaStream_t stream) {
  CombineGradStatsKernel<<<1, kThreadsPerBlock, 0, stream>>>(partials, count, result);
  return cudaGetLastError();
}

cudaError_t LaunchMaxAbs(const void* src, int32_t src_dtype, int64_t count, unsigned int* result,
                         cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  MaxAbsKernel<<<BlocksFor(count), kThreadsPerBlock, 0, stream>>>(src, src_dtype, count, result);
  return cudaGetLastError();
}

}  // namespace cuda_internal
}  // namespace zeroshard::engine
