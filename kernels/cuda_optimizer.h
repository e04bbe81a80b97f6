// The CUDA implementation of the optimizer API (plain C++ header, no CUDA headers): the fused
// update of many device-resident pieces in one launch, and the gradient statistics.
// Built only under --config=cuda.
#ifndef ZEROSHARD_KERNELS_CUDA_OPTIMIZER_H_
#define ZEROSHARD_KERNELS_CUDA_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"

namespace zeroshard::kernels {

// Runs the kernels on one CUDA stream, owning the pinned and device buffers their piece tables
// need.
// Thread contract: not thread-safe; use one instance per stream, from one thread at a time.
// Every CUDA error becomes a Status here (Internal, with CUDA's message); nothing else in the
// kernels reports CUDA errors.
class CudaOptimizerKernels {
 public:
  // `stream` is a cudaStream_t (null: the legacy default stream); the caller keeps it alive.
  // Fails (Unavailable) when there is no usable CUDA device.
  static absl::StatusOr<std::unique_ptr<CudaOptimizerKernels>> Create(void* stream);
  ~CudaOptimizerKernels();
  CudaOptimizerKernels(const CudaOptimizerKernels&) = delete;
  CudaOptimizerKernels& operator=(const CudaOptimizerKernels&) = delete;

  // As ApplyUpdateCpu, with every array of every piece in device memory. Enqueues one launch
  // on the stream and returns without waiting for it; the pieces may be reused at once.
  absl::Status ApplyUpdate(const OptimizerConfig& config, int64_t step, float grad_scale,
                           absl::Span<const UpdatePiece> pieces);

  // As ComputeGradStatsCpu (fp64 sums; the same bits whatever the launch shape, though not
  // the CPU's bits), for device-resident pieces. Waits for the stream.
  absl::StatusOr<GradStats> ComputeGradStats(absl::Span<const GradPiece> pieces);

  // Enqueues the sum of squares into one double of device memory and returns without waiting,
  // so it can go straight into a collective. A sum (or a sum of ranks' sums) is non-finite
  // exactly when some element was NaN or +-Inf: no separate flag is needed.
  absl::Status EnqueueSumSquares(absl::Span<const GradPiece> pieces, double* device_result);

  // Bytes this instance holds for its tables and sums: the pinned host copies plus the device
  // buffers (they grow to the largest launch and are kept).
  int64_t TableBytes() const;

 private:
  // One launch's piece and tile tables. The host writes them straight into pinned memory, so the
  // asynchronous upload reads them from there (not from a pageable temporary the driver would
  // stage); the kernel reads the device copy. `released` is recorded after the launch, and the
  // slot is rewritten only once it has passed, so neither copy changes under a queued upload or
  // kernel.
  struct TableSlot {
    void* host = nullptr;      // cudaMallocHost'd
    void* device = nullptr;    // cudaMalloc'd, the same capacity
    size_t capacity = 0;       // bytes of each
    void* released = nullptr;  // cudaEvent_t, after the last launch that read this slot
  };
  // Launches whose tables may be queued at once before the host waits for the oldest: the engine
  // queues one update and one statistics launch per step, so a slot is reused only after a
  // launch that finished long ago.
  static constexpr int kTableSlots = 2;

  explicit CudaOptimizerKernels(void* stream) : stream_(stream) {}

  // Makes the device buffer `*buffer` (of `*capacity` bytes) hold at least `bytes`.
  absl::Status Reserve(void** buffer, size_t* capacity, size_t bytes);
  // The next slot in turn, once its previous launch has passed, holding at least `bytes`.
  absl::StatusOr<TableSlot*> NextTableSlot(size_t bytes);
  // Enqueues the copy of the slot's first `bytes` bytes to its device buffer.
  absl::Status UploadTables(const TableSlot& slot, size_t bytes);
  // Records the slot's `released` event after a launch whose outcome is `launched` (also after a
  // failed launch: the upload before it may still be reading the slot); returns the first error.
  absl::Status ReleaseAfterLaunch(const TableSlot& slot, absl::Status launched);

  void* stream_;
  TableSlot table_slots_[kTableSlots];
  int next_table_slot_ = 0;
  void* device_sums_ = nullptr;  // per-tile sums, then the total
  size_t sums_capacity_ = 0;
};

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CUDA_OPTIMIZER_H_
