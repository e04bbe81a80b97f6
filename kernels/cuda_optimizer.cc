// The CUDA implementation's host side: validation, piece and tile tables; CUDA errors become
// absl::Status through common/cuda_status.h.
#include "kernels/cuda_optimizer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda_launch.h"

namespace zeroshard::kernels {
namespace {

using cuda_internal::DeviceStatsPiece;
using cuda_internal::DeviceTile;
using cuda_internal::DeviceUpdatePiece;

static_assert(cuda_internal::kDeviceStateArrays == kMaxStateArrays,
              "the device piece table holds every state array");

bool Aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

template <class Piece>
std::vector<DeviceTile> CutIntoTiles(absl::Span<const Piece> pieces, int64_t tile_elements) {
  std::vector<DeviceTile> tiles;
  for (size_t p = 0; p < pieces.size(); ++p) {
    for (int64_t begin = 0; begin < pieces[p].length; begin += tile_elements) {
      const int64_t end = std::min(pieces[p].length, begin + tile_elements);
      tiles.push_back(DeviceTile{begin, end, static_cast<int32_t>(p)});
    }
  }
  return tiles;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaOptimizerKernels>> CudaOptimizerKernels::Create(void* stream) {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device: ", error == cudaSuccess ? "none found" : cudaGetErrorString(error)));
  }
  return std::unique_ptr<CudaOptimizerKernels>(new CudaOptimizerKernels(stream));
}

CudaOptimizerKernels::~CudaOptimizerKernels() {
  // Errors while freeing are not actionable in a destructor.
  cudaFree(device_pieces_);
  cudaFree(device_tiles_);
  cudaFree(device_sums_);
}

absl::Status CudaOptimizerKernels::Reserve(void** buffer, size_t* capacity, size_t bytes) {
  if (bytes <= *capacity) return absl::OkStatus();
  // Earlier launches on the stream may still read the old buffer.
  ZS_RETURN_IF_ERROR(common::CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                                        "cudaStreamSynchronize"));
  cudaFree(*buffer);
  *buffer = nullptr;
  *capacity = 0;
  const size_t grown = bytes < 4096 ? 4096 : bytes + bytes / 2;
  ZS_RETURN_IF_ERROR(common::CudaStatus(cudaMalloc(buffer, grown), "cudaMalloc"));
  *capacity = grown;
  return absl::OkStatus();
}

absl::Status CudaOptimizerKernels::Upload(void** buffer, size_t* capacity, const void* host,
                                          size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(Reserve(buffer, capacity, bytes));
  // From pageable memory the copy has read the host data when it returns.
  return common::CudaStatus(cudaMemcpyAsync(*buffer, host, bytes, cudaMemcpyHostToDevice,
                                            static_cast<cudaStream_t>(stream_)),
                            "cudaMemcpyAsync(host to device)");
}

absl::Status CudaOptimizerKernels::ApplyUpdate(const OptimizerConfig& config, int64_t step,
                                               float grad_scale,
                                               absl::Span<const UpdatePiece> pieces) {
  ZS_RETURN_IF_ERROR(ValidateUpdate(config, step, grad_scale, pieces));
  if (pieces.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("too many pieces for one launch");
  }
  const int state_arrays = StateArraysPerParam(config);
  const bool has_momentum = config.kind == OptimizerKind::kSgd && config.momentum != 0.0;
  std::vector<DeviceUpdatePiece> table(pieces.size());  // value-initialised: zeros
  for (size_t i = 0; i < pieces.size(); ++i) {
    const UpdatePiece& piece = pieces[i];
    DeviceUpdatePiece& d = table[i];
    d.scalars = MakeElementScalars(config, step, grad_scale, piece);
    d.grad = piece.grad;
    d.master = piece.master;
    for (int s = 0; s < state_arrays; ++s) d.state[s] = piece.state[s];
    d.param_copy = piece.param_copy;
    d.length = piece.length;
    d.grad_dtype = static_cast<int32_t>(piece.grad_dtype);
    d.copy_dtype = static_cast<int32_t>(piece.param_dtype);
    d.has_momentum = has_momentum ? 1 : 0;
    bool aligned = Aligned(piece.master, 16) &&
                   Aligned(piece.grad, piece.grad_dtype == DType::kFloat32 ? 16 : 8);
    for (int s = 0; s < state_arrays; ++s) aligned = aligned && Aligned(piece.state[s], 16);
    if (piece.param_copy != nullptr) {
      aligned = aligned && Aligned(piece.param_copy, piece.param_dtype == DType::kFloat32 ? 16 : 8);
    }
    d.vector_aligned = aligned ? 1 : 0;
  }
  const std::vector<DeviceTile> tiles = CutIntoTiles(pieces, cuda_internal::kUpdateTileElements);
  if (tiles.empty()) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(Upload(&device_pieces_, &pieces_capacity_, table.data(),
                            table.size() * sizeof(DeviceUpdatePiece)));
  ZS_RETURN_IF_ERROR(
      Upload(&device_tiles_, &tiles_capacity_, tiles.data(), tiles.size() * sizeof(DeviceTile)));
  return common::CudaStatus(
      cuda_internal::LaunchUpdate(
          config.kind, static_cast<const DeviceUpdatePiece*>(device_pieces_),
          static_cast<const DeviceTile*>(device_tiles_), static_cast<int64_t>(tiles.size()),
          static_cast<cudaStream_t>(stream_)),
      "optimizer update launch");
}

absl::Status CudaOptimizerKernels::EnqueueSumSquares(absl::Span<const GradPiece> pieces,
                                                     double* device_result) {
  ZS_RETURN_IF_ERROR(ValidateGradPieces(pieces));
  if (device_result == nullptr) return absl::InvalidArgumentError("device_result is null");
  std::vector<DeviceStatsPiece> table(pieces.size());  // value-initialised: zeros
  for (size_t i = 0; i < pieces.size(); ++i) {
    table[i].data = pieces[i].data;
    table[i].length = pieces[i].length;
    table[i].dtype = static_cast<int32_t>(pieces[i].dtype);
  }
  const std::vector<DeviceTile> tiles = CutIntoTiles(pieces, cuda_internal::kStatsTileElements);
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  ZS_RETURN_IF_ERROR(Upload(&device_pieces_, &pieces_capacity_, table.data(),
                            table.size() * sizeof(DeviceStatsPiece)));
  ZS_RETURN_IF_ERROR(
      Upload(&device_tiles_, &tiles_capacity_, tiles.data(), tiles.size() * sizeof(DeviceTile)));
  ZS_RETURN_IF_ERROR(Reserve(&device_sums_, &sums_capacity_, (num_tiles + 1) * sizeof(double)));
  return common::CudaStatus(
      cuda_internal::LaunchSumSquares(static_cast<const DeviceStatsPiece*>(device_pieces_),
                                      static_cast<const DeviceTile*>(device_tiles_), num_tiles,
                                      static_cast<double*>(device_sums_), device_result,
                                      static_cast<cudaStream_t>(stream_)),
      "sum of squares launch");
}

absl::StatusOr<GradStats> CudaOptimizerKernels::ComputeGradStats(
    absl::Span<const GradPiece> pieces) {
  ZS_RETURN_IF_ERROR(ValidateGradPieces(pieces));
  // The total goes to the slot after the tile sums (EnqueueSumSquares reserves the same size,
  // so the buffer is not reallocated under it).
  const int64_t num_tiles =
      static_cast<int64_t>(CutIntoTiles(pieces, cuda_internal::kStatsTileElements).size());
  ZS_RETURN_IF_ERROR(Reserve(&device_sums_, &sums_capacity_, (num_tiles + 1) * sizeof(double)));
  double* device_total = static_cast<double*>(device_sums_) + num_tiles;
  ZS_RETURN_IF_ERROR(EnqueueSumSquares(pieces, device_total));
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  double total = 0.0;
  ZS_RETURN_IF_ERROR(common::CudaStatus(
      cudaMemcpyAsync(&total, device_total, sizeof(double), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(device to host)"));
  ZS_RETURN_IF_ERROR(common::CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  GradStats stats;
  stats.sum_squares = total;
  // As on the CPU: finite squares cannot overflow an fp64 sum, so only NaN/Inf make it non-finite.
  stats.non_finite = !std::isfinite(total);
  return stats;
}

}  // namespace zeroshard::kernels
