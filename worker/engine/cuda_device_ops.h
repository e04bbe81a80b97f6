// CudaDeviceOps: the engine's device on a CUDA GPU: cudaMalloc'd buffers (counted by the engine's
// allocator like host ones), element conversions and the CUDA optimizer kernels, all queued on
// one compute stream. Built only under --config=cuda; this header has no CUDA includes.
#ifndef ZEROSHARD_WORKER_ENGINE_CUDA_DEVICE_OPS_H_
#define ZEROSHARD_WORKER_ENGINE_CUDA_DEVICE_OPS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/cuda_optimizer.h"
#include "worker/engine/device_ops.h"

namespace zeroshard::engine {

// Owns a non-blocking compute stream on one device. The workload and the NcclCommunicator
// (NcclCommunicatorOptions::compute_stream) must use stream(), so everything that touches the
// engine's buffers is ordered on it; NCCL's own stream waits for it at each collective. A
// collective's results are visible to compute-stream work queued after its
// Work::WaitOnComputeStream (a device-side wait; the host goes on) or after its Work::Wait
// returned.
//
// Thread contract: as DeviceOps. Operations run on the thread that called Create (it made
// `device` current) or on threads that selected the same device; AllocateZeroed and Free select
// the device themselves and are thread-safe. Every CUDA error becomes a Status (Internal, or
// ResourceExhausted for memory) in one place, cuda_device_ops.cc; the optimizer kernels report
// their own (kernels/cuda_optimizer.h).
class CudaDeviceOps final : public DeviceOps {
 public:
  // Makes `device` current on the calling thread and creates the stream. FailedPrecondition when
  // there is no such device (or no usable driver). Blocks come from `memory` when given (device
  // memory of `device`, zero-filled, e.g. blocks an attached trainer opens through CUDA IPC; it
  // must outlive this object), else from cudaMalloc.
  static absl::StatusOr<std::unique_ptr<CudaDeviceOps>> Create(int device,
                                                               MemoryBacking* memory = nullptr);
  // Waits for the stream, then destroys it. Every buffer must have been freed.
  ~CudaDeviceOps() override;
  CudaDeviceOps(const CudaDeviceOps&) = delete;
  CudaDeviceOps& operator=(const CudaDeviceOps&) = delete;

  // The compute stream, a cudaStream_t.
  void* stream() const { return stream_; }
  int device() const { return device_; }

  // cudaMalloc (or the MemoryBacking's block) and a zero fill (synchronous); null on any CUDA
  // error.
  void* AllocateZeroed(int64_t bytes) override;
  // Waits for every stream of the device (queued work, the compute stream's or a collective's on
  // NCCL's stream, may still use the block), then cudaFree (or the MemoryBacking's Free).
  void Free(void* data) override;
  const char* name() const override { return name_.c_str(); }
  bool host_memory() const override { return false; }
  // Both copies are synchronous: they return once the data has arrived.
  absl::Status CopyFromHost(void* dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, int64_t bytes) override;
  absl::Status StoreScaledGradient(const float* grad, float scale, int64_t count,
                                   numerics::DType storage_dtype, void* dst,
                                   numerics::DType dst_dtype) override;
  absl::Status ConvertElements(const void* src, numerics::DType src_dtype, void* dst,
                               numerics::DType dst_dtype, int64_t count) override;
  absl::Status ZeroElements(void* dst, numerics::DType dtype, int64_t count) override;
  absl::Status AddElements(const void* src, numerics::DType src_dtype, void* dst,
                           numerics::DType dst_dtype, int64_t count) override;
  absl::Status ApplyUpdate(const kernels::OptimizerConfig& config, int64_t step, float grad_scale,
                           absl::Span<const kernels::UpdatePiece> pieces) override;
  absl::StatusOr<kernels::GradStats> ComputeGradStats(
      absl::Span<const kernels::GradPiece> pieces) override;
  int64_t GradStatsChunkElements() const override;
  // Both queue one kernel and return; the chunks are not checked (they are device memory).
  absl::Status ConvertWithGradStats(const void* src, numerics::DType src_dtype, void* dst,
                                    numerics::DType dst_dtype,
                                    const kernels::GradStatsChunk* chunks, int64_t num_chunks,
                                    double* partials) override;
  absl::StatusOr<double> MaxAbs(absl::Span<const kernels::GradPiece> pieces) override;
  absl::Status CombineGradStats(const double* partials, int64_t count, double* result) override;
  absl::Status Synchronize() override;
  int64_t KernelTableBytes() const override { return kernels_->TableBytes(); }

 private:
  CudaDeviceOps(int device, void* stream, std::unique_ptr<kernels::CudaOptimizerKernels> kernels,
                MemoryBacking* memory);

  const int device_;
  const std::string name_;  // "cuda:<device>"
  void* const stream_;      // cudaStream_t, owned
  // On stream_; reset before the stream is destroyed.
  std::unique_ptr<kernels::CudaOptimizerKernels> kernels_;
  MemoryBacking* const memory_;  // null: cudaMalloc
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_CUDA_DEVICE_OPS_H_
