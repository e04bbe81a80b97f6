// NcclCommunicator: unique id through the Store, non-blocking NCCL communicator, collectives on a
// communication stream, Work as CUDA events polled with ncclCommGetAsyncError, ncclCommAbort.
// CUDA errors become Status through common/cuda_status.h, NCCL errors through NcclStatus below.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace zeroshard::comm {
namespace {

// How often a waiter re-checks an event, the async error and its deadlines.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);
// Bound on flushing a healthy communicator at destruction.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(60);

absl::Status NcclStatus(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": NCCL error ", static_cast<int>(result), ": ",
                                           ncclGetErrorString(result));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

#define ZS_NCCL_RETURN_IF_ERROR(expr) ZS_RETURN_IF_ERROR(NcclStatus((expr), #expr))

bool ToNcclType(ElementType type, ncclDataType_t* nccl_type) {
  switch (type) {
    case ElementType::kFloat64:
      *nccl_type = ncclFloat64;
      return true;
    case ElementType::kFloat32:
      *nccl_type = ncclFloat32;
      return true;
    case ElementType::kBFloat16:
      *nccl_type = ncclBfloat16;
      return true;
    case ElementType::kFloat16:
      *nccl_type = ncclFloat16;
      return true;
    case ElementType::kInt32:
      *nccl_type = ncclInt32;
      return true;
    case ElementType::kInt64:
      *nccl_type = ncclInt64;
      return true;
  }
  return false;
}

ncclRedOp_t ToNcclOp(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

// Polls a non-blocking communicator until its pending call (init, enqueue, finalize) settles.
absl::Status AwaitSettled(ncclComm_t comm, absl::Time deadline, absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ZS_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress) return NcclStatus(state, what);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": still in progress at the deadline"));
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace

// The NCCL communicator and its stream, shared by NcclCommunicator and its Work handles.
// Thread-safe: `mu_` guards the communicator handle, which Abort() (any thread) and a failing
// Wait (any thread) end, while the owner thread enqueues under the same lock.
class NcclCommunicator::Impl : public std::enable_shared_from_this<NcclCommunicator::Impl> {
 public:
  Impl(int rank, int world_size, int device, cudaStream_t compute_stream, ncclComm_t comm,
       cudaStream_t stream, int32_t* barrier_word)
      : rank_(rank),
        world_size_(world_size),
        device_(device),
        compute_stream_(compute_stream),
        stream_(stream),
        barrier_word_(barrier_word),
        comm_(comm) {}

  ~Impl() {
    cudaSetDevice(device_);
    ncclComm_t comm;
    {
      absl::MutexLock lock(&mu_);
      comm = comm_;
      comm_ = nullptr;
    }
    if (comm != nullptr) {
      // Flush what was issued, then free; if that fails, abort (nothing else is left to do).
      absl::Status finalized = NcclStatus(ncclCommFinalize(comm), "ncclCommFinalize");
      if (finalized.ok()) {
        finalized = AwaitSettled(comm, absl::Now() + kFinalizeTimeout, "ncclCommFinalize");
      }
      if (finalized.ok()) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    cudaStreamDestroy(stream_);
    cudaFree(barrier_word_);
  }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int32_t* barrier_word() const { return barrier_word_; }

  // Queues one operation: the communication stream waits for the compute stream, `enqueue` issues
  // the NCCL call(s) (each followed by AwaitSettled, as non-blocking communicators require), and
  // an event marks the end. Called from the owner thread.
  std::unique_ptr<Work> Issue(const CollectiveOptions& options, int64_t bytes_moved,
                              const std::function<absl::Status(ncclComm_t, cudaStream_t)>& enqueue);

  // Ends the communicator with `cause` (first cause wins) and returns the status the caller
  // reports.
  absl::Status Fail(absl::Status cause) {
    absl::MutexLock lock(&mu_);
    return FailLocked(std::move(cause));
  }

  // OK while healthy; ABORTED after Abort() or a failure; fails the communicator on an async
  // NCCL error.
  absl::Status Check() {
    absl::MutexLock lock(&mu_);
    if (failed_) return absl::AbortedError(failure_.message());
    ncclResult_t state = ncclSuccess;
    absl::Status status = NcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (status.ok()) status = NcclStatus(state, "asynchronous NCCL error");
    if (!status.ok()) return FailLocked(status);
    return absl::OkStatus();
  }

  bool failed() const {
    absl::MutexLock lock(&mu_);
    return failed_;
  }

  void Abort() { Fail(absl::AbortedError("communicator aborted")).IgnoreError(); }

  CommunicatorStats stats() const {
    CommunicatorStats stats;
    stats.operations_completed = operations_completed_.load(std::memory_order_relaxed);
    stats.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    // NCCL's rings and trees receive what they send, so one count serves both.
    stats.bytes_received = bytes_sent_.load(std::memory_order_relaxed);
    return stats;
  }

  void CountCompleted() { operations_completed_.fetch_add(1, std::memory_order_relaxed); }

 private:
  absl::Status FailLocked(absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_) {
      failed_ = true;
      failure_ = cause;
      if (comm_ != nullptr) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      }
    }
    return cause;
  }

  absl::Status EnqueueLocked(const std::function<absl::Status(ncclComm_t, cudaStream_t)>& enqueue,
                             cudaEvent_t done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  const int world_size_;
  const int device_;
  const cudaStream_t compute_stream_;
  const cudaStream_t stream_;
  int32_t* const barrier_word_;

  mutable absl::Mutex mu_;
  // Null once aborted (ncclCommAbort frees it) or finalized.
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> operations_completed_{0};
  std::atomic<int64_t> bytes_sent_{0};
};

namespace {

// A queued NCCL operation: an event after it on the communication stream. Thread-safe.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::Impl> impl, cudaEvent_t done, absl::Time deadline)
      : impl_(std::move(impl)), done_(done), deadline_(deadline) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time wait_deadline = absl::Now() + timeout;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (finished_) return status_;
      }
      const cudaError_t query = cudaEventQuery(done_);
      if (query == cudaSuccess) return Finish(absl::OkStatus());
      if (query != cudaErrorNotReady)
        return Finish(impl_->Fail(common::CudaStatus(query, "collective")));
      absl::Status health = impl_->Check();
      if (!health.ok()) return Finish(health);
      const absl::Time now = absl::Now();
      if (now >= deadline_) {
        return Finish(impl_->Fail(absl::DeadlineExceededError("NCCL collective timed out")));
      }
      if (now >= wait_deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("operation still running after waiting ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(kPollInterval);
    }
  }

  bool Done() const override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return true;
    }
    return cudaEventQuery(done_) == cudaSuccess || impl_->failed();
  }

 private:
  absl::Status Finish(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      finished_ = true;
      status_ = std::move(status);
      if (status_.ok()) impl_->CountCompleted();
    }
    return status_;
  }

  const std::shared_ptr<NcclCommunicator::Impl> impl_;
  const cudaEvent_t done_;
  const absl::Time deadline_;
  mutable absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status NcclCommunicator::Impl::EnqueueLocked(
    const std::function<absl::Status(ncclComm_t, cudaStream_t)>& enqueue, cudaEvent_t done) {
  ZS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaEvent_t ready;
  ZS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  absl::Status status =
      common::CudaStatus(cudaEventRecord(ready, compute_stream_), "cudaEventRecord");
  if (status.ok()) {
    status = common::CudaStatus(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
  }
  cudaEventDestroy(ready);
  ZS_RETURN_IF_ERROR(status);
  ZS_RETURN_IF_ERROR(enqueue(comm_, stream_));
  return common::CudaStatus(cudaEventRecord(done, stream_), "cudaEventRecord");
}

std::unique_ptr<Work> NcclCommunicator::Impl::Issue(
    const CollectiveOptions& options, int64_t bytes_moved,
    const std::function<absl::Status(ncclComm_t, cudaStream_t)>& enqueue) {
  const absl::Time deadline = absl::Now() + options.timeout;
  cudaEvent_t done;
  absl::Status created = common::CudaStatus(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                                            "cudaEventCreate");
  if (!created.ok()) return MakeFinishedWork(created);
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) {
      cudaEventDestroy(done);
      return MakeFinishedWork(
          absl::AbortedError(absl::StrCat("communicator ended: ", failure_.ToString())));
    }
    status = EnqueueLocked(
        [&](ncclComm_t comm, cudaStream_t stream) {
          ZS_RETURN_IF_ERROR(enqueue(comm, stream));
          return AwaitSettled(comm, deadline, "enqueue");
        },
        done);
    if (!status.ok()) status = FailLocked(status);
  }
  if (!status.ok()) {
    cudaEventDestroy(done);
    return MakeFinishedWork(status);
  }
  bytes_sent_.fetch_add(bytes_moved, std::memory_order_relaxed);
  return std::make_unique<NcclWork>(shared_from_this(), done, deadline);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of world size ",
                                                   options.world_size, " is out of range"));
  }
  if (options.world_size > 1 && options.store == nullptr) {
    return absl::InvalidArgumentError("a store is required when world_size > 1");
  }
  const absl::Time deadline = absl::Now() + options.init_timeout;
  ZS_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));

  ncclUniqueId id;
  if (options.rank == 0) {
    ZS_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    if (options.world_size > 1) {
      ZS_RETURN_IF_ERROR(options.store->Set(options.store_key,
                                            absl::string_view(id.internal, sizeof(id.internal))));
    }
  } else {
    ZS_ASSIGN_OR_RETURN(std::string value,
                        options.store->Get(options.store_key, options.init_timeout));
    if (value.size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("NCCL unique id under '", options.store_key, "' has ",
                                              value.size(), " bytes"));
    }
    std::memcpy(id.internal, value.data(), sizeof(id.internal));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ZS_NCCL_RETURN_IF_ERROR(
      ncclCommInitRankConfig(&comm, options.world_size, id, options.rank, &config));
  absl::Status initialized = AwaitSettled(comm, deadline, "ncclCommInitRankConfig");
  if (!initialized.ok()) {
    ncclCommAbort(comm);
    return initialized;
  }

  cudaStream_t stream = nullptr;
  int32_t* barrier_word = nullptr;
  absl::Status resources = common::CudaStatus(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (resources.ok()) {
    resources = common::CudaStatus(
        cudaMalloc(reinterpret_cast<void**>(&barrier_word), sizeof(int32_t)), "cudaMalloc");
  }
  if (resources.ok()) {
    resources = common::CudaStatus(cudaMemset(barrier_word, 0, sizeof(int32_t)), "cudaMemset");
  }
  if (!resources.ok()) {
    ncclCommAbort(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (barrier_word != nullptr) cudaFree(barrier_word);
    return resources;
  }
  auto impl = std::make_shared<Impl>(options.rank, options.world_size, options.device,
                                     static_cast<cudaStream_t>(options.compute_stream), comm,
                                     stream, barrier_word);
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return impl_->rank(); }
int NcclCommunicator::world_size() const { return impl_->world_size(); }

namespace {

absl::Status ValidateBuffer(const void* data, size_t count, ElementType type,
                            ncclDataType_t* nccl_type) {
  if (!ToNcclType(type, nccl_type)) return absl::InvalidArgumentError("invalid element type");
  if (count > 0 && data == nullptr) {
    return absl::InvalidArgumentError("null buffer with a nonzero count");
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Work> NcclCommunicator::ReduceScatter(const void* input, void* output,
                                                      size_t piece_count, ElementType type,
                                                      ReduceOp op,
                                                      const CollectiveOptions& options) {
  ncclDataType_t nccl_type;
  absl::Status valid = ValidateBuffer(input, piece_count, type, &nccl_type);
  if (valid.ok()) valid = ValidateBuffer(output, piece_count, type, &nccl_type);
  if (!valid.ok()) return MakeFinishedWork(valid);
  if (piece_count == 0) return MakeFinishedWork(absl::OkStatus());
  const int64_t bytes = (world_size() - 1) * piece_count * ElementSize(type);
  return impl_->Issue(options, bytes, [=](ncclComm_t comm, cudaStream_t stream) {
    return NcclStatus(
        ncclReduceScatter(input, output, piece_count, nccl_type, ToNcclOp(op), comm, stream),
        "ncclReduceScatter");
  });
}

std::unique_ptr<Work> NcclCommunicator::ReduceScatterInPlace(void* buffer, size_t piece_count,
                                                             ElementType type, ReduceOp op,
                                                             const CollectiveOptions& options) {
  char* bucket = static_cast<char*>(buffer);
  return ReduceScatter(bucket, bucket + rank() * piece_count * ElementSize(type), piece_count, type,
                       op, options);
}

std::unique_ptr<Work> NcclCommunicator::AllGather(const void* input, void* output,
                                                  size_t piece_count, ElementType type,
                                                  const CollectiveOptions& options) {
  ncclDataType_t nccl_type;
  absl::Status valid = ValidateBuffer(input, piece_count, type, &nccl_type);
  if (valid.ok()) valid = ValidateBuffer(output, piece_count, type, &nccl_type);
  if (!valid.ok()) return MakeFinishedWork(valid);
  if (piece_count == 0) return MakeFinishedWork(absl::OkStatus());
  const int64_t bytes = (world_size() - 1) * piece_count * ElementSize(type);
  return impl_->Issue(options, bytes, [=](ncclComm_t comm, cudaStream_t stream) {
    return NcclStatus(ncclAllGather(input, output, piece_count, nccl_type, comm, stream),
                      "ncclAllGather");
  });
}

std::unique_ptr<Work> NcclCommunicator::AllGatherInPlace(void* buffer, size_t piece_count,
                                                         ElementType type,
                                                         const CollectiveOptions& options) {
  char* bucket = static_cast<char*>(buffer);
  return AllGather(bucket + rank() * piece_count * ElementSize(type), bucket, piece_count, type,
                   options);
}

std::unique_ptr<Work> NcclCommunicator::AllReduce(void* buffer, size_t count, ElementType type,
                                                  ReduceOp op, const CollectiveOptions& options) {
  ncclDataType_t nccl_type;
  absl::Status valid = ValidateBuffer(buffer, count, type, &nccl_type);
  if (!valid.ok()) return MakeFinishedWork(valid);
  if (count == 0) return MakeFinishedWork(absl::OkStatus());
  const int world = world_size();
  const size_t element_size = ElementSize(type);
  const int64_t bytes = 2 * (world - 1) * (count / world) * element_size;
  const int rank_index = rank();
  return impl_->Issue(options, bytes, [=](ncclComm_t comm, cudaStream_t stream) -> absl::Status {
    if (count % world != 0) {
      return NcclStatus(ncclAllReduce(buffer, buffer, count, nccl_type, ToNcclOp(op), comm, stream),
                        "ncclAllReduce");
    }
    // The same reduce-scatter the zero modes run, then the all-gather: bitwise equal pieces.
    const size_t piece = count / world;
    char* bucket = static_cast<char*>(buffer);
    char* own = bucket + rank_index * piece * element_size;
    ZS_RETURN_IF_ERROR(
        NcclStatus(ncclReduceScatter(bucket, own, piece, nccl_type, ToNcclOp(op), comm, stream),
                   "ncclReduceScatter"));
    ZS_RETURN_IF_ERROR(AwaitSettled(comm, absl::Now() + options.timeout, "ncclReduceScatter"));
    return NcclStatus(ncclAllGather(own, bucket, piece, nccl_type, comm, stream), "ncclAllGather");
  });
}

std::unique_ptr<Work> NcclCommunicator::Broadcast(void* buffer, size_t count, ElementType type,
                                                  int root, const CollectiveOptions& options) {
  ncclDataType_t nccl_type;
  absl::Status valid = ValidateBuffer(buffer, count, type, &nccl_type);
  if (!valid.ok()) return MakeFinishedWork(valid);
  if (root < 0 || root >= world_size()) {
    return MakeFinishedWork(absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside world size ", world_size())));
  }
  if (count == 0) return MakeFinishedWork(absl::OkStatus());
  const int64_t bytes = rank() == root ? count * ElementSize(type) : 0;
  return impl_->Issue(options, bytes, [=](ncclComm_t comm, cudaStream_t stream) {
    return NcclStatus(ncclBroadcast(buffer, buffer, count, nccl_type, root, comm, stream),
                      "ncclBroadcast");
  });
}

std::unique_ptr<Work> NcclCommunicator::Barrier(const CollectiveOptions& options) {
  int32_t* word = impl_->barrier_word();
  return impl_->Issue(options, 0, [=](ncclComm_t comm, cudaStream_t stream) {
    return NcclStatus(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, stream),
                      "ncclAllReduce (barrier)");
  });
}

void NcclCommunicator::Abort() { impl_->Abort(); }

CommunicatorStats NcclCommunicator::stats() const { return impl_->stats(); }

}  // namespace zeroshard::comm
