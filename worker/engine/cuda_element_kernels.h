// Internal to CudaDeviceOps: launchers of the engine's element conversions and of the gradient
// statistics riding on them, on a CUDA stream (cuda_element_kernels.cu, compiled by nvcc; called
// from cuda_device_ops.cc).
#ifndef ZEROSHARD_WORKER_ENGINE_CUDA_ELEMENT_KERNELS_H_
#define ZEROSHARD_WORKER_ENGINE_CUDA_ELEMENT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zeroshard::engine {
namespace cuda_internal {

// Enqueue on `stream`; return the launch error, if any. Dtypes are numerics::DType values.
// dst[i] = round_to(dst_dtype, round_to(storage_dtype, grad[i] * scale)), as StoreScaledGradient.
cudaError_t LaunchStoreScaledGradient(const float* grad, float scale, int64_t count,
                                      int32_t storage_dtype, void* dst, int32_t dst_dtype,
                                      cudaStream_t stream);
// dst[i] = round_to(dst_dtype, src[i]), as ConvertElements (src and dst do not overlap).
cudaError_t LaunchConvertElements(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                                  int64_t count, cudaStream_t stream);

// dst[i] = round_to(dst_dtype, dst[i] + src[i]), the sum in fp32, as element_convert.h's
// AddElements (src and dst do not overlap).
cudaError_t LaunchAddElements(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                              int64_t count, cudaStream_t stream);

// The most elements of one statistics chunk: kernels/cuda_launch.h's kStatsTileElements, so a
// piece cut into chunks of this size gets CudaOptimizerKernels::ComputeGradStats's bits.
inline constexpr int64_t kGradStatsChunkElements = int64_t{1} << 14;

// A chunk of LaunchConvertWithGradStats, laid out as kernels::GradStatsChunk (checked in
// cuda_device_ops.cc): elements [begin, begin + length).
struct DeviceGradStatsChunk {
  int64_t begin;
  int64_t length;
};

// For each chunk k (device memory): dst[i] = round_to(dst_dtype, src[i]) over the chunk's
// elements, as LaunchConvertElements (equal dtypes copy the bits; src == dst with equal dtypes
// writes nothing), and partials[k] = the sum of squares of the converted values in fp64, summed
// as the kernels' per-tile sum of squares: thread t adds elements begin + t, begin + t + 256,
// ... in order, then the block's fixed tree.
// REQUIRES: every chunk holds at most kGradStatsChunkElements elements.
cudaError_t LaunchConvertWithGradStats(const void* src, int32_t src_dtype, void* dst,
                                       int32_t dst_dtype, const DeviceGradStatsChunk* chunks,
                                       int64_t num_chunks, double* partials, cudaStream_t stream);
// result[0] = partials[0, count) added as the kernels' final sum of squares (one block: thread
// t adds partials t, t + 256, ... in order, then the fixed tree); result[1] = 1 when that sum is
// NaN or +-Inf, else 0. All three pointers are device memory.
cudaError_t LaunchCombineGradStats(const double* partials, int64_t count, double* result,
                                   cudaStream_t stream);

// result[0] (device memory, the bits of a non-negative float or NaN) = the largest of itself and
// |src[i]| over [0, count), compared as unsigned bits (which order non-negative floats, and put
// NaN above infinity). Set result[0] to 0 before the first piece.
cudaError_t LaunchMaxAbs(const void* src, int32_t src_dtype, int64_t count, unsigned int* result,
                         cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_CUDA_ELEMENT_KERNELS_H_
