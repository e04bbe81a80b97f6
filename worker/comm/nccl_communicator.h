// NcclCommunicator: the GPU Communicator over NCCL (non-blocking communicator, a communication
// stream, CUDA events for Work, async-error polling and ncclCommAbort). Built only under
// --config=cuda; this header has no CUDA or NCCL includes, so host code can hold one.
#ifndef ZEROSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define ZEROSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace zeroshard::comm {

struct NcclCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  // CUDA device ordinal this rank uses.
  int device = 0;
  // Carries the NCCL unique id from rank 0 to the others (used only inside Create).
  Store* store = nullptr;
  std::string store_key = "nccl/unique_id";
  // Bound on Create: the unique id exchange and ncclCommInitRankConfig.
  absl::Duration init_timeout = absl::Seconds(120);
  // The cudaStream_t (as void*) whose work produces and consumes the buffers; every operation's
  // communication waits for the work already queued on it. nullptr means the legacy default
  // stream.
  void* compute_stream = nullptr;
};

// Buffers are device memory. Each operation is queued on the communication stream after an event
// of compute_stream, between two CUDA events; Work::RunTime is the time between them
// (cudaEventElapsedTime), so time queued behind the compute stream or earlier operations does not
// count (a failed operation reports none: its events may never complete). Work::WaitOnComputeStream
// makes compute_stream wait for the operation's completion event on the device
// (cudaStreamWaitEvent) without blocking the host. Work::Wait and Done poll that event on the host
// together with ncclCommGetAsyncError, the operation's deadline (CollectiveOptions::timeout,
// counted from the issue) and Abort(); a watchdog thread polls the same for every operation not yet
// finished, so deadlines and async errors are enforced even while no host thread waits (the compute
// stream may be waiting on the device). A NCCL error or a deadline passing aborts the NCCL
// communicator (ncclCommAbort, which also ends the collectives' kernels, so a stream waiting on
// them goes on), and every later operation fails with ABORTED, as Communicator says.
//
// Reduction order: AllReduce of a count world_size() divides runs as ncclReduceScatter followed
// by ncclAllGather on the same buffer, so its pieces carry exactly ReduceScatter's bits (ddp and
// zero agree bitwise); other counts use ncclAllReduce. NCCL reduces bf16/fp16 with its own
// per-step rounding; results are deterministic for a fixed world size and NCCL configuration.
//
// Thread contract: as Communicator's: operations are issued from one thread; they run on the
// communication stream in issue order. Abort(), stats() and Work handles are thread-safe
// (WaitOnComputeStream from the thread that queues compute-stream work). The lock Abort() takes
// is held only for single NCCL calls, never across a poll's sleep, so Abort() is prompt while an
// enqueue settles or a waiter polls. CUDA errors become a Status through common/cuda_status.h,
// NCCL errors in one place in nccl_communicator.cc.
class NcclCommunicator : public Communicator {
 public:
  // All ranks call this with the same world size and store key.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclCommunicatorOptions& options);

  // Once the last Work handle is gone too: stops the watchdog, then finalizes and destroys the
  // NCCL communicator (after waiting for queued operations), or only releases what is left after
  // an abort.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int world_size() const override;
  std::unique_ptr<Work> ReduceScatter(const void* input, void* output, size_t piece_count,
                                      ElementType type, ReduceOp op,
                                      const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> ReduceScatterInPlace(void* buffer, size_t piece_count, ElementType type,
                                             ReduceOp op,
                                             const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> AllGather(const void* input, void* output, size_t piece_count,
                                  ElementType type, const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> AllGatherInPlace(void* buffer, size_t piece_count, ElementType type,
                                         const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> AllReduce(void* buffer, size_t count, ElementType type, ReduceOp op,
                                  const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> Broadcast(void* buffer, size_t count, ElementType type, int root,
                                  const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> Barrier(const CollectiveOptions& options = {}) override;
  void Abort() override;
  CommunicatorStats stats() const override;

  // The implementation (CUDA and NCCL types), defined in nccl_communicator.cc.
  class Impl;

 private:
  explicit NcclCommunicator(std::shared_ptr<Impl> impl);

  // Shared with every Work handle, so a handle stays usable after the communicator is gone.
  const std::shared_ptr<Impl> impl_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
