// Internal to the CUDA kernels: what the host code (cuda_optimizer.cc, compiled by the C++
// compiler) passes to the kernel launchers (cuda_kernels.cu, compiled by nvcc).
#ifndef ZEROSHARD_KERNELS_CUDA_LAUNCH_H_
#define ZEROSHARD_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/optimizer_kind.h"
#include "kernels/update_math.h"

namespace zeroshard::kernels {
namespace cuda_internal {

inline constexpr int kThreadsPerBlock = 256;
// Pieces are cut into tiles of these many elements (multiples of 4, so 4-element vectors never
// straddle tiles); one block works on one tile at a time.
inline constexpr int64_t kUpdateTileElements = int64_t{1} << 14;
inline constexpr int64_t kStatsTileElements = int64_t{1} << 14;
inline constexpr int kMaxBlocks = 4096;
inline constexpr int kDeviceStateArrays = 3;  // kMaxStateArrays (checked in cuda_optimizer.cc)

// One piece as the update kernel sees it.
struct DeviceUpdatePiece {
  ElementScalars scalars;
  const void* grad;
  float* master;
  float* state[kDeviceStateArrays];  // null where the optimizer uses fewer
  void* param_copy;                  // null: no copy
  int64_t length;
  int32_t grad_dtype;  // a numerics::DType value
  int32_t copy_dtype;  // a numerics::DType value
  int32_t has_momentum;
  int32_t vector_aligned;  // every array allows 16-byte (fp32) or 8-byte (16-bit) vector access
};

struct DeviceStatsPiece {
  const void* data;
  int64_t length;
  int32_t dtype;
};

// A tile: elements [begin, end) of piece `piece`.
struct DeviceTile {
  int64_t begin;
  int64_t end;
  int32_t piece;
};

// Enqueues the update of every tile on `stream`. Returns the launch error, if any.
cudaError_t LaunchUpdate(OptimizerKind kind, const DeviceUpdatePiece* pieces,
                         const DeviceTile* tiles, int64_t num_tiles, cudaStream_t stream);

// Enqueues the two reduction stages: per-tile sums into `tile_sums` (num_tiles doubles), then
// their sum, in tile order within a fixed tree, into `result` (one double).
cudaError_t LaunchSumSquares(const DeviceStatsPiece* pieces, const DeviceTile* tiles,
                             int64_t num_tiles, double* tile_sums, double* result,
                             cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CUDA_LAUNCH_H_
