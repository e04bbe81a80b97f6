// The engine's element conversions on a CUDA device: one thread per element (grid-stride), the
// roundings of kernels/dtype.h, so the results are the host loops' bits (element_convert.cc).
#include <cuda_runtime.h>

#include "kernels/dtype.h"
#include "worker/engine/cuda_element_kernels.h"

namespace zeroshard::engine {
namespace cuda_internal {
namespace {

using kernels::DType;

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 4096;

__device__ float LoadElement(const void* data, int32_t dtype, int64_t i) {
  if (dtype == static_cast<int32_t>(DType::kFloat32)) return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == static_cast<int32_t>(DType::kBFloat16) ? kernels::BFloat16ToFloat(bits)
                                                         : kernels::HalfToFloat(bits);
}

__device__ void StoreElement(void* data, int32_t dtype, int64_t i, float value) {
  if (dtype == static_cast<int32_t>(DType::kFloat32)) {
    static_cast<float*>(data)[i] = value;
  } else if (dtype == static_cast<int32_t>(DType::kBFloat16)) {
    static_cast<uint16_t*>(data)[i] = kernels::FloatToBFloat16(value);
  } else {
    static_cast<uint16_t*>(data)[i] = kernels::FloatToHalf(value);
  }
}

// The value `dtype` storage holds for `value` (rounded to nearest even, widened back).
__device__ float RoundTo(int32_t dtype, float value) {
  if (dtype == static_cast<int32_t>(DType::kBFloat16)) {
    return kernels::BFloat16ToFloat(kernels::FloatToBFloat16(value));
  }
  if (dtype == static_cast<int32_t>(DType::kFloat16)) {
    return kernels::HalfToFloat(kernels::FloatToHalf(value));
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

int BlocksFor(int64_t count) {
  const int64_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
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

}  // namespace cuda_internal
}  // namespace zeroshard::engine
