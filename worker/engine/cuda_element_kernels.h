// Internal to CudaDeviceOps: launchers of the engine's element conversions on a CUDA stream
// (cuda_element_kernels.cu, compiled by nvcc; called from cuda_device_ops.cc).
#ifndef ZEROSHARD_WORKER_ENGINE_CUDA_ELEMENT_KERNELS_H_
#define ZEROSHARD_WORKER_ENGINE_CUDA_ELEMENT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zeroshard::engine {
namespace cuda_internal {

// Enqueue on `stream`; return the launch error, if any. Dtypes are kernels::DType values.
// dst[i] = round_to(dst_dtype, round_to(storage_dtype, grad[i] * scale)), as StoreScaledGradient.
cudaError_t LaunchStoreScaledGradient(const float* grad, float scale, int64_t count,
                                      int32_t storage_dtype, void* dst, int32_t dst_dtype,
                                      cudaStream_t stream);
// dst[i] = round_to(dst_dtype, src[i]), as ConvertElements (src and dst do not overlap).
cudaError_t LaunchConvertElements(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                                  int64_t count, cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_CUDA_ELEMENT_KERNELS_H_
