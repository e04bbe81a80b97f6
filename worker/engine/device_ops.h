// DeviceOps: where the engine's buffers live and the element work the engine runs on them
// (conversions into buckets, the fused update, the gradient statistics). HostDeviceOps is the
// CPU implementation (host memory, the CPU kernels); CudaDeviceOps (cuda_device_ops.h) the GPU one.
#ifndef ZEROSHARD_WORKER_ENGINE_DEVICE_OPS_H_
#define ZEROSHARD_WORKER_ENGINE_DEVICE_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"
#include "kernels/thread_pool.h"
#include "numerics/dtype.h"
#include "worker/engine/counting_allocator.h"

namespace zeroshard::engine {

// Every pointer an operation takes, except those named `host_*`, is memory of this device (from
// AllocateZeroed, or a workload's buffers on the same device). Operations may be asynchronous
// (queued, in call order, on the device's one compute stream): a later operation, and a
// collective issued after it on a communicator that waits for the compute stream, sees its
// results. Operations that hand values to the host (CopyToHost, ComputeGradStats) and
// Synchronize() wait for everything queued before them; the others (ConvertWithGradStats and
// CombineGradStats included) may return before they have run.
//
// Thread contract: the memory functions (MemoryBacking) are thread-safe; everything else is
// called from one thread at a time (the engine's owner thread).
class DeviceOps : public MemoryBacking {
 public:
  ~DeviceOps() override = default;

  // "cpu" or "cuda:N", for messages.
  virtual const char* name() const = 0;
  // Whether buffers are host memory the caller may read and write directly.
  virtual bool host_memory() const = 0;

  // Copies `bytes` bytes from host memory into device memory; `host_src` may be reused on return.
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, int64_t bytes) = 0;
  // Copies `bytes` bytes of device memory into host memory, after everything queued before.
  virtual absl::Status CopyToHost(void* host_dst, const void* src, int64_t bytes) = 0;

  // As element_convert.h's functions of the same names, on device memory. StoreScaledGradient
  // may scale fp32 in place (grad == dst with fp32 storage and destination).
  virtual absl::Status StoreScaledGradient(const float* grad, float scale, int64_t count,
                                           numerics::DType storage_dtype, void* dst,
                                           numerics::DType dst_dtype) = 0;
  virtual absl::Status ConvertElements(const void* src, numerics::DType src_dtype, void* dst,
                                       numerics::DType dst_dtype, int64_t count) = 0;
  virtual absl::Status ZeroElements(void* dst, numerics::DType dtype, int64_t count) = 0;
  // As element_convert.h's AddElements: the engine's zero2 gradient accumulation across
  // micro-batches (Engine::EndMicroBatch). The host and CUDA implement it; the default answers
  // Unimplemented.
  virtual absl::Status AddElements(const void* src, numerics::DType src_dtype, void* dst,
                                   numerics::DType dst_dtype, int64_t count);

  // The fused optimizer update and the gradient statistics (kernels/optimizer.h) over pieces in
  // device memory. ComputeGradStats waits for everything queued before it.
  virtual absl::Status ApplyUpdate(const kernels::OptimizerConfig& config, int64_t step,
                                   float grad_scale,
                                   absl::Span<const kernels::UpdatePiece> pieces) = 0;
  virtual absl::StatusOr<kernels::GradStats> ComputeGradStats(
      absl::Span<const kernels::GradPiece> pieces) = 0;

  // The gradient statistics on the pass that moves reduced gradients into their storage, so they
  // cost no pass of their own. The most elements one statistics chunk may hold: the chunk size
  // of this device's ComputeGradStats, so that a piece cut into chunks of this size from its
  // start gets ComputeGradStats's bits from ConvertWithGradStats and CombineGradStats.
  virtual int64_t GradStatsChunkElements() const = 0;
  // For each chunk k of chunks[0, num_chunks): converts elements [begin, begin + length) of
  // `src` into the same elements of `dst`, as ConvertElements, and sets partials[k] to the fp64
  // sum of squares of the converted values. src == dst with equal dtypes: the statistics only.
  // `chunks` and `partials` are device memory. InvalidArgument for a bad dtype or chunk where
  // the device can check it.
  // REQUIRES: every chunk holds at most GradStatsChunkElements() elements; source and
  // destination elements do not overlap unless src == dst with equal dtypes.
  virtual absl::Status ConvertWithGradStats(const void* src, numerics::DType src_dtype, void* dst,
                                            numerics::DType dst_dtype,
                                            const kernels::GradStatsChunk* chunks,
                                            int64_t num_chunks, double* partials) = 0;
  // The largest |element| over the pieces (opt.clip_grad_norm_'s infinity norm), NaN when one is
  // NaN; 0 for no elements. Waits for everything queued before it. The host and CUDA implement
  // it; the default answers Unimplemented.
  virtual absl::StatusOr<double> MaxAbs(absl::Span<const kernels::GradPiece> pieces);

  // Adds partials[0, count) in a fixed order into result[0] (device memory) and sets result[1] to
  // 1 when that sum is NaN or +-Inf (some converted value was), else 0: with one ComputeGradStats
  // chunk per partial, in its order, the numbers ComputeGradStats gives.
  virtual absl::Status CombineGradStats(const double* partials, int64_t count, double* result) = 0;

  // Waits until everything queued has finished.
  virtual absl::Status Synchronize() = 0;

  // Memory the device's kernels hold for their own launch tables, outside the engine's allocator
  // (pinned host plus device memory, in bytes); the worker reports it as its own category.
  virtual int64_t KernelTableBytes() const { return 0; }
};

// Host memory and the CPU kernels (kernels/cpu_optimizer.h) on its own thread pool; every
// operation runs to completion before it returns. Thread contract: as DeviceOps.
class HostDeviceOps final : public DeviceOps {
 public:
  // `threads` (>= 1) run the optimizer kernels; results do not depend on it. Blocks come from
  // `memory` when given (e.g. shared memory an attached trainer maps; it must outlive this
  // object), else from the heap.
  explicit HostDeviceOps(int threads, MemoryBacking* memory = nullptr);

  void* AllocateZeroed(int64_t bytes) override { return memory_->AllocateZeroed(bytes); }
  void Free(void* data) override { memory_->Free(data); }
  const char* name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
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
  absl::Status ConvertWithGradStats(const void* src, numerics::DType src_dtype, void* dst,
                                    numerics::DType dst_dtype,
                                    const kernels::GradStatsChunk* chunks, int64_t num_chunks,
                                    double* partials) override;
  absl::StatusOr<double> MaxAbs(absl::Span<const kernels::GradPiece> pieces) override;
  absl::Status CombineGradStats(const double* partials, int64_t count, double* result) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  HostMemoryBacking heap_;
  MemoryBacking* const memory_;
  kernels::ThreadPool thread_pool_;
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_DEVICE_OPS_H_
