// The CUDA implementation's host side: validation, piece and tile tables (written into pinned
// staging slots); CUDA errors become absl::Status through common/cuda_status.h.
#include "kernels/cuda_optimizer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>

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

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t AsEvent(void* event) { return static_cast<cudaEvent_t>(event); }

// Tiles the pieces are cut into: one per `tile_elements` elements of each piece.
template <class Piece>
int64_t CountTiles(absl::Span<const Piece> pieces, int64_t tile_elements) {
  int64_t tiles = 0;
  for (const Piece& piece : pieces) tiles += (piece.length + tile_elements - 1) / tile_elements;
  return tiles;
}

// Writes the tiles CountTiles counted, in piece order, into `tiles`.
template <class Piece>
void WriteTiles(absl::Span<const Piece> pieces, int64_t tile_elements, DeviceTile* tiles) {
  for (size_t p = 0; p < pieces.size(); ++p) {
    for (int64_t begin = 0; begin < pieces[p].length; begin += tile_elements) {
      const int64_t end = std::min(pieces[p].length, begin + tile_elements);
      new (tiles++) DeviceTile{begin, end, static_cast<int32_t>(p)};
    }
  }
}

// Byte offset of the tile table behind a piece table of `piece_bytes` bytes in one slot.
size_t TileTableOffset(size_t piece_bytes) {
  constexpr size_t kAlignment = alignof(std::max_align_t);
  return (piece_bytes + kAlignment - 1) / kAlignment * kAlignment;
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
  for (TableSlot& slot : table_slots_) {
    if (slot.released != nullptr) {
      // A queued upload may still read the pinned tables.
      cudaEventSynchronize(AsEvent(slot.released));
      cudaEventDestroy(AsEvent(slot.released));
    }
    cudaFreeHost(slot.host);
    cudaFree(slot.device);
  }
  cudaFree(device_sums_);
}

int64_t CudaOptimizerKernels::TableBytes() const {
  int64_t bytes = static_cast<int64_t>(sums_capacity_);
  for (const TableSlot& slot : table_slots_) bytes += 2 * static_cast<int64_t>(slot.capacity);
  return bytes;
}

absl::Status CudaOptimizerKernels::Reserve(void** buffer, size_t* capacity, size_t bytes) {
  if (bytes <= *capacity) return absl::OkStatus();
  // Earlier launches on the stream may still read the old buffer.
  ZS_RETURN_IF_ERROR(
      common::CudaStatus(cudaStreamSynchronize(AsStream(stream_)), "cudaStreamSynchronize"));
  cudaFree(*buffer);
  *buffer = nullptr;
  *capacity = 0;
  const size_t grown = bytes < 4096 ? 4096 : bytes + bytes / 2;
  ZS_RETURN_IF_ERROR(common::CudaStatus(cudaMalloc(buffer, grown), "cudaMalloc"));
  *capacity = grown;
  return absl::OkStatus();
}

absl::StatusOr<CudaOptimizerKernels::TableSlot*> CudaOptimizerKernels::NextTableSlot(size_t bytes) {
  TableSlot& slot = table_slots_[next_table_slot_];
  next_table_slot_ = (next_table_slot_ + 1) % kTableSlots;
  if (slot.released == nullptr) {
    cudaEvent_t released = nullptr;
    ZS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&released, cudaEventDisableTiming));
    slot.released = released;
  }
  // The slot's previous launch: its upload may still read the pinned copy, its kernel the device
  // copy. Usually long done (see kTableSlots), so this rarely blocks.
  ZS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(AsEvent(slot.released)));
  if (bytes > slot.capacity) {
    cudaFreeHost(slot.host);
    cudaFree(slot.device);
    slot.host = nullptr;
    slot.device = nullptr;
    slot.capacity = 0;
    const size_t grown = bytes < 4096 ? 4096 : bytes + bytes / 2;
    ZS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&slot.host, grown));
    ZS_CUDA_RETURN_IF_ERROR(cudaMalloc(&slot.device, grown));
    slot.capacity = grown;
  }
  return &slot;
}

absl::Status CudaOptimizerKernels::UploadTables(const TableSlot& slot, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return common::CudaStatus(
      cudaMemcpyAsync(slot.device, slot.host, bytes, cudaMemcpyHostToDevice, AsStream(stream_)),
      "cudaMemcpyAsync(tables to device)");
}

absl::Status CudaOptimizerKernels::ReleaseAfterLaunch(const TableSlot& slot,
                                                      absl::Status launched) {
  const absl::Status recorded = common::CudaStatus(
      cudaEventRecord(AsEvent(slot.released), AsStream(stream_)), "cudaEventRecord");
  return launched.ok() ? recorded : launched;
}

absl::Status CudaOptimizerKernels::ApplyUpdate(const OptimizerConfig& config, int64_t step,
                                               float grad_scale,
                                               absl::Span<const UpdatePiece> pieces) {
  ZS_RETURN_IF_ERROR(ValidateUpdate(config, step, grad_scale, pieces));
  if (pieces.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("too many pieces for one launch");
  }
  const int64_t num_tiles = CountTiles(pieces, cuda_internal::kUpdateTileElements);
  if (num_tiles == 0) return absl::OkStatus();
  const size_t tiles_offset = TileTableOffset(pieces.size() * sizeof(DeviceUpdatePiece));
  const size_t bytes = tiles_offset + num_tiles * sizeof(DeviceTile);
  ZS_ASSIGN_OR_RETURN(TableSlot * slot, NextTableSlot(bytes));

  const int state_arrays = StateArraysPerParam(config);
  const bool has_momentum = config.kind == OptimizerKind::kSgd && config.momentum != 0.0;
  auto* table = static_cast<DeviceUpdatePiece*>(slot->host);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const UpdatePiece& piece = pieces[i];
    DeviceUpdatePiece& d = *new (table + i) DeviceUpdatePiece{};  // zeros: unused state arrays
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
                   Aligned(piece.grad, piece.grad_dtype == numerics::DType::kFloat32 ? 16 : 8);
    for (int s = 0; s < state_arrays; ++s) aligned = aligned && Aligned(piece.state[s], 16);
    if (piece.param_copy != nullptr) {
      aligned = aligned &&
                Aligned(piece.param_copy, piece.param_dtype == numerics::DType::kFloat32 ? 16 : 8);
    }
    d.vector_aligned = aligned ? 1 : 0;
  }
  WriteTiles(pieces, cuda_internal::kUpdateTileElements,
             reinterpret_cast<DeviceTile*>(static_cast<char*>(slot->host) + tiles_offset));
  ZS_RETURN_IF_ERROR(UploadTables(*slot, bytes));
  const char* device_tables = static_cast<const char*>(slot->device);
  return ReleaseAfterLaunch(
      *slot,
      common::CudaStatus(cuda_internal::LaunchUpdate(
                             config.kind, reinterpret_cast<const DeviceUpdatePiece*>(device_tables),
                             reinterpret_cast<const DeviceTile*>(device_tables + tiles_offset),
                             num_tiles, AsStream(stream_)),
                         "optimizer update launch"));
}

absl::Status CudaOptimizerKernels::EnqueueSumSquares(absl::Span<const GradPiece> pieces,
                                                     double* device_result) {
  ZS_RETURN_IF_ERROR(ValidateGradPieces(pieces));
  if (device_result == nullptr) return absl::InvalidArgumentError("device_result is null");
  const int64_t num_tiles = CountTiles(pieces, cuda_internal::kStatsTileElements);
  const size_t tiles_offset = TileTableOffset(pieces.size() * sizeof(DeviceStatsPiece));
  const size_t bytes = tiles_offset + num_tiles * sizeof(DeviceTile);
  ZS_RETURN_IF_ERROR(Reserve(&device_sums_, &sums_capacity_, (num_tiles + 1) * sizeof(double)));
  ZS_ASSIGN_OR_RETURN(TableSlot * slot, NextTableSlot(bytes));
  auto* table = static_cast<DeviceStatsPiece*>(slot->host);
  for (size_t i = 0; i < pieces.size(); ++i) {
    DeviceStatsPiece& d = *new (table + i) DeviceStatsPiece{};
    d.data = pieces[i].data;
    d.length = pieces[i].length;
    d.dtype = static_cast<int32_t>(pieces[i].dtype);
  }
  WriteTiles(pieces, cuda_internal::kStatsTileElements,
             reinterpret_cast<DeviceTile*>(static_cast<char*>(slot->host) + tiles_offset));
  ZS_RETURN_IF_ERROR(UploadTables(*slot, bytes));
  const char* device_tables = static_cast<const char*>(slot->device);
  return ReleaseAfterLaunch(
      *slot, common::CudaStatus(
                 cuda_internal::LaunchSumSquares(
                     reinterpret_cast<const DeviceStatsPiece*>(device_tables),
                     reinterpret_cast<const DeviceTile*>(device_tables + tiles_offset), num_tiles,
                     static_cast<double*>(device_sums_), device_result, AsStream(stream_)),
                 "sum of squares launch"));
}

absl::StatusOr<GradStats> CudaOptimizerKernels::ComputeGradStats(
    absl::Span<const GradPiece> pieces) {
  ZS_RETURN_IF_ERROR(ValidateGradPieces(pieces));
  // The total goes to the slot after the tile sums (EnqueueSumSquares reserves the same size,
  // so the buffer is not reallocated under it).
  const int64_t num_tiles = CountTiles(pieces, cuda_internal::kStatsTileElements);
  ZS_RETURN_IF_ERROR(Reserve(&device_sums_, &sums_capacity_, (num_tiles + 1) * sizeof(double)));
  double* device_total = static_cast<double*>(device_sums_) + num_tiles;
  ZS_RETURN_IF_ERROR(EnqueueSumSquares(pieces, device_total));
  const cudaStream_t stream = AsStream(stream_);
  // The host needs this value: the one wait of the statistics.
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
