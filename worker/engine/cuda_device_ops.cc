// CudaDeviceOps: device memory, copies and element conversions on the compute stream, and the
// CUDA optimizer kernels. CUDA errors become absl::Status through common/cuda_status.h.
#include "worker/engine/cuda_device_ops.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/engine/cuda_element_kernels.h"

namespace zeroshard::engine {
namespace {

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// The engine's chunk table goes to the kernel as it is.
static_assert(sizeof(cuda_internal::DeviceGradStatsChunk) == sizeof(kernels::GradStatsChunk) &&
                  offsetof(cuda_internal::DeviceGradStatsChunk, begin) ==
                      offsetof(kernels::GradStatsChunk, begin) &&
                  offsetof(cuda_internal::DeviceGradStatsChunk, length) ==
                      offsetof(kernels::GradStatsChunk, length),
              "DeviceGradStatsChunk is laid out as kernels::GradStatsChunk");

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeviceOps>> CudaDeviceOps::Create(int device,
                                                                     MemoryBacking* memory) {
  ZS_RETURN_IF_ERROR(common::UseCudaDevice(device));
  cudaStream_t stream = nullptr;
  ZS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::StatusOr<std::unique_ptr<kernels::CudaOptimizerKernels>> kernels =
      kernels::CudaOptimizerKernels::Create(stream);
  if (!kernels.ok()) {
    cudaStreamDestroy(stream);
    return kernels.status();
  }
  return std::unique_ptr<CudaDeviceOps>(
      new CudaDeviceOps(device, stream, *std::move(kernels), memory));
}

CudaDeviceOps::CudaDeviceOps(int device, void* stream,
                             std::unique_ptr<kernels::CudaOptimizerKernels> kernels,
                             MemoryBacking* memory)
    : device_(device),
      name_(absl::StrCat("cuda:", device)),
      stream_(stream),
      kernels_(std::move(kernels)),
      memory_(memory) {}

CudaDeviceOps::~CudaDeviceOps() {
  const absl::Status synced = Synchronize();
  if (!synced.ok()) ZS_LOG(WARNING) << name_ << ": at destruction: " << synced;
  // The kernels' own buffers go first; then the stream they ran on.
  kernels_.reset();
  const absl::Status destroyed =
      common::CudaStatus(cudaStreamDestroy(AsStream(stream_)), "cudaStreamDestroy");
  if (!destroyed.ok()) ZS_LOG(WARNING) << name_ << ": " << destroyed;
}

void* CudaDeviceOps::AllocateZeroed(int64_t bytes) {
  if (memory_ != nullptr) return memory_->AllocateZeroed(bytes);
  void* data = nullptr;
  absl::Status status = common::CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  if (status.ok()) status = common::CudaStatus(cudaMalloc(&data, bytes), "cudaMalloc");
  if (status.ok()) {
    status =
        common::CudaStatus(cudaMemsetAsync(data, 0, bytes, AsStream(stream_)), "cudaMemsetAsync");
    if (status.ok()) status = Synchronize();
    if (!status.ok()) {
      cudaFree(data);
      data = nullptr;
    }
  }
  if (!status.ok()) {
    ZS_LOG(WARNING) << name_ << ": allocating " << bytes << " bytes: " << status;
    return nullptr;
  }
  return data;
}

void CudaDeviceOps::Free(void* data) {
  if (data == nullptr) return;
  absl::Status status = common::CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  // The compute stream is not the block's only user: a collective on NCCL's stream may still read
  // or write it (that stream waits for the compute stream, not the other way round), so wait for
  // every stream of the device.
  if (status.ok()) status = common::CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (status.ok()) {
    if (memory_ != nullptr) {
      memory_->Free(data);
    } else {
      status = common::CudaStatus(cudaFree(data), "cudaFree");
    }
  }
  if (!status.ok()) ZS_LOG(WARNING) << name_ << ": freeing a buffer: " << status;
}

absl::Status CudaDeviceOps::CopyFromHost(void* dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  ZS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, AsStream(stream_)));
  return Synchronize();
}

absl::Status CudaDeviceOps::CopyToHost(void* host_dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  ZS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, AsStream(stream_)));
  return Synchronize();
}

absl::Status CudaDeviceOps::StoreScaledGradient(const float* grad, float scale, int64_t count,
                                                numerics::DType storage_dtype, void* dst,
                                                numerics::DType dst_dtype) {
  return common::CudaStatus(cuda_internal::LaunchStoreScaledGradient(
                                grad, scale, count, static_cast<int32_t>(storage_dtype), dst,
                                static_cast<int32_t>(dst_dtype), AsStream(stream_)),
                            "StoreScaledGradient kernel");
}

absl::Status CudaDeviceOps::ConvertElements(const void* src, numerics::DType src_dtype, void* dst,
                                            numerics::DType dst_dtype, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    if (src == dst) return absl::OkStatus();
    return common::CudaStatus(cudaMemcpyAsync(dst, src, count * numerics::DTypeSize(src_dtype),
                                              cudaMemcpyDeviceToDevice, AsStream(stream_)),
                              "cudaMemcpyAsync(device to device)");
  }
  return common::CudaStatus(cuda_internal::LaunchConvertElements(
                                src, static_cast<int32_t>(src_dtype), dst,
                                static_cast<int32_t>(dst_dtype), count, AsStream(stream_)),
                            "ConvertElements kernel");
}

absl::Status CudaDeviceOps::AddElements(const void* src, numerics::DType src_dtype, void* dst,
                                        numerics::DType dst_dtype, int64_t count) {
  return common::CudaStatus(
      cuda_internal::LaunchAddElements(src, static_cast<int32_t>(src_dtype), dst,
                                       static_cast<int32_t>(dst_dtype), count, AsStream(stream_)),
      "AddElements kernel");
}

absl::Status CudaDeviceOps::ZeroElements(void* dst, numerics::DType dtype, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  return common::CudaStatus(
      cudaMemsetAsync(dst, 0, count * numerics::DTypeSize(dtype), AsStream(stream_)),
      "cudaMemsetAsync");
}

absl::Status CudaDeviceOps::ApplyUpdate(const kernels::OptimizerConfig& config, int64_t step,
                                        float grad_scale,
                                        absl::Span<const kernels::UpdatePiece> pieces) {
  return kernels_->ApplyUpdate(config, step, grad_scale, pieces);
}

absl::StatusOr<kernels::GradStats> CudaDeviceOps::ComputeGradStats(
    absl::Span<const kernels::GradPiece> pieces) {
  return kernels_->ComputeGradStats(pieces);
}

int64_t CudaDeviceOps::GradStatsChunkElements() const {
  return cuda_internal::kGradStatsChunkElements;
}

absl::Status CudaDeviceOps::ConvertWithGradStats(const void* src, numerics::DType src_dtype,
                                                 void* dst, numerics::DType dst_dtype,
                                                 const kernels::GradStatsChunk* chunks,
                                                 int64_t num_chunks, double* partials) {
  if (!numerics::IsValidDType(src_dtype) || !numerics::IsValidDType(dst_dtype)) {
    return absl::InvalidArgumentError("ConvertWithGradStats: invalid dtype");
  }
  if (src == dst && src_dtype != dst_dtype) {
    return absl::InvalidArgumentError("ConvertWithGradStats: src == dst but the dtypes differ");
  }
  return common::CudaStatus(
      cuda_internal::LaunchConvertWithGradStats(
          src, static_cast<int32_t>(src_dtype), dst, static_cast<int32_t>(dst_dtype),
          reinterpret_cast<const cuda_internal::DeviceGradStatsChunk*>(chunks), num_chunks,
          partials, AsStream(stream_)),
      "ConvertWithGradStats kernel");
}

absl::Status CudaDeviceOps::CombineGradStats(const double* partials, int64_t count,
                                             double* result) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("count must be >= 0, got ", count));
  return common::CudaStatus(
      cuda_internal::LaunchCombineGradStats(partials, count, result, AsStream(stream_)),
      "CombineGradStats kernel");
}

absl::StatusOr<double> CudaDeviceOps::MaxAbs(absl::Span<const kernels::GradPiece> pieces) {
  ZS_RETURN_IF_ERROR(kernels::ValidateGradPieces(pieces));
  // A rare call (opt.clip_grad_norm_ with the infinity norm): its own 4 bytes of scratch.
  unsigned int* largest = nullptr;
  ZS_CUDA_RETURN_IF_ERROR(cudaMalloc(&largest, sizeof(unsigned int)));
  absl::Status status = common::CudaStatus(
      cudaMemsetAsync(largest, 0, sizeof(unsigned int), AsStream(stream_)), "cudaMemsetAsync");
  for (const kernels::GradPiece& piece : pieces) {
    if (!status.ok()) break;
    status = common::CudaStatus(
        cuda_internal::LaunchMaxAbs(piece.data, static_cast<int32_t>(piece.dtype), piece.length,
                                    largest, AsStream(stream_)),
        "MaxAbs kernel");
  }
  unsigned int bits = 0;
  if (status.ok()) {
    status = common::CudaStatus(
        cudaMemcpyAsync(&bits, largest, sizeof(bits), cudaMemcpyDeviceToHost, AsStream(stream_)),
        "cudaMemcpyAsync");
  }
  if (status.ok()) status = Synchronize();
  cudaFree(largest);
  ZS_RETURN_IF_ERROR(status);
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof(value));
  return static_cast<double>(value);
}

absl::Status CudaDeviceOps::Synchronize() {
  return common::CudaStatus(cudaStreamSynchronize(AsStream(stream_)), "cudaStreamSynchronize");
}

}  // namespace zeroshard::engine
