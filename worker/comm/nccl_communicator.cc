// NcclCommunicator: unique id through the Store, non-blocking NCCL communicator, collectives on a
// communication stream, Work as CUDA events (completion and run time) polled together with
// ncclCommGetAsyncError by waiters and by a watchdog thread, ncclCommAbort.
// CUDA errors become Status through common/cuda_status.h, NCCL errors through NcclStatus below.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace zeroshard::comm {
namespace {

// How often a host waiter re-checks an event, the async error and its deadlines.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);
// How often the watchdog re-checks the operations nobody waits for on the host: often enough
// for deadlines of milliseconds, rare enough to cost nothing beside a step.
constexpr absl::Duration kWatchdogInterval = absl::Milliseconds(1);
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

// Polls a non-blocking communicator until its pending call settles. Only for calls no other
// thread can see yet (init) or any longer (finalize); collectives settle through Impl::Settle.
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

// One NCCL call of an operation (an all-reduce may be two), issued on the communication stream.
struct NcclCall {
  std::function<ncclResult_t(ncclComm_t, cudaStream_t)> issue;
  const char* what;
};

// One issued operation: CUDA events before and after it on the communication stream, and how it
// ended. Shared by its Work handle and the communicator's watchdog, so neither outlives the
// events the other still polls. Thread-safe.
class NcclOperation {
 public:
  // Both events keep timing (no cudaEventDisableTiming): the run time is the time between them.
  static absl::StatusOr<std::shared_ptr<NcclOperation>> Create(absl::Time deadline) {
    cudaEvent_t start = nullptr;
    ZS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    cudaEvent_t done = nullptr;
    const absl::Status created = common::CudaStatus(cudaEventCreate(&done), "cudaEventCreate");
    if (!created.ok()) {
      cudaEventDestroy(start);
      return created;
    }
    return std::make_shared<NcclOperation>(start, done, deadline);
  }

  NcclOperation(cudaEvent_t start, cudaEvent_t done, absl::Time deadline)
      : start_(start), done_(done), deadline_(deadline) {}
  ~NcclOperation() {
    cudaEventDestroy(start_);
    cudaEventDestroy(done_);
  }
  NcclOperation(const NcclOperation&) = delete;
  NcclOperation& operator=(const NcclOperation&) = delete;

  cudaEvent_t start() const { return start_; }
  cudaEvent_t done() const { return done_; }
  absl::Time deadline() const { return deadline_; }

  // Records the outcome; the first call wins. Returns whether this call finished the operation.
  bool Finish(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
    if (status.ok()) {
      // Both events have completed (done_ has, and start_ is before it on the same stream).
      float milliseconds = 0.0f;
      if (cudaEventElapsedTime(&milliseconds, start_, done_) == cudaSuccess) {
        run_time_ = absl::Milliseconds(static_cast<double>(milliseconds));
      }
    }
    status_ = std::move(status);
    return true;
  }

  bool finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  // The outcome; OK until finished.
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  std::optional<absl::Duration> run_time() const {
    absl::MutexLock lock(&mu_);
    return run_time_;
  }

 private:
  const cudaEvent_t start_;
  const cudaEvent_t done_;
  const absl::Time deadline_;
  mutable absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Set only for an operation that finished OK (a failed one's events may never complete).
  std::optional<absl::Duration> run_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// The NCCL communicator, its stream and its watchdog, shared by NcclCommunicator and its Work
// handles. Thread-safe. `mu_` guards the communicator handle and is held only for single NCCL
// calls, never across a sleep, so Abort() (any thread) waits at most for one such call; `ended_`
// mirrors `failed_` for readers that must not take the lock. The owner thread issues; host
// waiters (any thread) and the watchdog poll operations and may end the communicator.
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
    // The watchdog first: it polls the communicator torn down below.
    {
      absl::MutexLock lock(&watch_mu_);
      stopping_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
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
    {
      absl::MutexLock lock(&watch_mu_);
      outstanding_.clear();
    }
    cudaStreamDestroy(stream_);
    cudaFree(barrier_word_);
  }

  // Starts the watchdog; called once, by Create.
  void StartWatchdog() {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int32_t* barrier_word() const { return barrier_word_; }

  // Queues one operation (see Enqueue) and hands it to the watchdog. Called from the owner
  // thread.
  std::unique_ptr<Work> Issue(const CollectiveOptions& options, int64_t bytes_moved,
                              absl::Span<const NcclCall> calls);

  // Finishes `operation` when its outcome is known: its completion event fired (OK, unless the
  // communicator ended meanwhile), the communicator ended (ABORTED) or reported an async error,
  // or its deadline passed (which ends the communicator). Returns whether it is finished.
  bool Poll(NcclOperation& operation);

  // Makes the compute stream wait for `operation` on the device (cudaStreamWaitEvent), so the
  // host does not block; the watchdog still enforces the deadline and async errors, and an
  // abort ends the collective's kernels, so the compute stream cannot wait forever.
  absl::Status OrderComputeStreamAfter(NcclOperation& operation);

  // Ends the communicator with `cause` (first cause wins) and returns the status the caller
  // reports.
  absl::Status Fail(absl::Status cause) {
    absl::MutexLock lock(&mu_);
    return FailLocked(std::move(cause));
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

 private:
  absl::Status FailLocked(absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_) {
      failed_ = true;
      failure_ = cause;
      // Set before the abort, so a poller that sees a collective's event complete because of
      // the abort also sees the communicator ended (Poll checks this after the event).
      ended_.store(true);
      if (comm_ != nullptr) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      }
    }
    return cause;
  }

  // ABORTED naming the cause once the communicator ended.
  absl::Status EndedError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::AbortedError(absl::StrCat("communicator ended: ", failure_.ToString()));
  }

  // OK while healthy (an enqueue still settling counts as healthy); ABORTED after Abort() or a
  // failure; ends the communicator on an async NCCL error.
  absl::Status Check() {
    absl::MutexLock lock(&mu_);
    if (failed_) return EndedError();
    ncclResult_t state = ncclSuccess;
    absl::Status status = NcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (status.ok()) status = NcclStatus(state, "asynchronous NCCL error");
    if (!status.ok()) return FailLocked(status);
    return absl::OkStatus();
  }

  // The communication stream waits for the compute stream's queued work (which produces the
  // inputs), `start` is recorded, each call is issued and settled, and `done` is recorded.
  absl::StatusOr<std::shared_ptr<NcclOperation>> Enqueue(absl::Time deadline,
                                                         absl::Span<const NcclCall> calls);

  // Issues one NCCL call under mu_, then polls until the non-blocking communicator settled it,
  // taking mu_ only for each ncclCommGetAsyncError: a slow settle never holds up Abort().
  absl::Status IssueAndSettle(const NcclCall& call, absl::Time deadline);

  // Finishes `operation` with `status`; counts it when it completed.
  void Complete(NcclOperation& operation, absl::Status status) {
    const bool ok = status.ok();
    if (operation.Finish(std::move(status)) && ok) {
      operations_completed_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Polls every outstanding operation until the communicator is destroyed, so deadlines and
  // async errors end the communicator even while no host thread waits (the compute stream may be
  // waiting on the device, OrderComputeStreamAfter).
  void WatchdogLoop();

  bool WatchdogHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu_) {
    return stopping_ || !outstanding_.empty();
  }

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
  std::atomic<bool> ended_{false};

  // Never held together with mu_ or an operation's lock, except that the watchdog reads
  // operations' finished() under it (those locks take no other).
  absl::Mutex watch_mu_;
  std::vector<std::shared_ptr<NcclOperation>> outstanding_ ABSL_GUARDED_BY(watch_mu_);
  bool stopping_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watchdog_;

  std::atomic<int64_t> operations_completed_{0};
  std::atomic<int64_t> bytes_sent_{0};
};

namespace {

// A queued NCCL operation. Thread-safe; WaitOnComputeStream is for the thread that queues
// compute-stream work.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::Impl> impl, std::shared_ptr<NcclOperation> operation)
      : impl_(std::move(impl)), operation_(std::move(operation)) {}

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time wait_deadline = absl::Now() + timeout;
    while (!impl_->Poll(*operation_)) {
      if (absl::Now() >= wait_deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("operation still running after waiting ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(kPollInterval);
    }
    return operation_->status();
  }

  absl::Status WaitOnComputeStream() override {
    return impl_->OrderComputeStreamAfter(*operation_);
  }

  bool Done() const override { return impl_->Poll(*operation_); }

  std::optional<absl::Duration> RunTime() const override {
    if (!impl_->Poll(*operation_)) return std::nullopt;
    return operation_->run_time();
  }

 private:
  const std::shared_ptr<NcclCommunicator::Impl> impl_;
  const std::shared_ptr<NcclOperation> operation_;
};

}  // namespace

bool NcclCommunicator::Impl::Poll(NcclOperation& operation) {
  if (operation.finished()) return true;
  const cudaError_t query = cudaEventQuery(operation.done());
  if (query == cudaSuccess) {
    // An abort ends the collective's kernels, which completes the event without a result.
    Complete(operation, ended_.load() ? Check() : absl::OkStatus());
    return true;
  }
  if (query != cudaErrorNotReady) {
    Complete(operation, Fail(common::CudaStatus(query, "collective")));
    return true;
  }
  absl::Status health = Check();
  if (!health.ok()) {
    Complete(operation, std::move(health));
    return true;
  }
  if (absl::Now() >= operation.deadline()) {
    Complete(operation, Fail(absl::DeadlineExceededError("NCCL collective timed out")));
    return true;
  }
  return false;
}

absl::Status NcclCommunicator::Impl::OrderComputeStreamAfter(NcclOperation& operation) {
  // Finished: the host has seen the outcome, and the results (if any) are already visible.
  if (operation.finished()) return operation.status();
  absl::Status status = common::CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  if (status.ok()) {
    status = common::CudaStatus(cudaStreamWaitEvent(compute_stream_, operation.done(), 0),
                                "cudaStreamWaitEvent(compute stream, collective)");
  }
  if (!status.ok()) {
    // The compute stream would run ahead of the collective: nothing after it can be trusted.
    Complete(operation, Fail(std::move(status)));
    return operation.status();
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Impl::IssueAndSettle(const NcclCall& call, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return EndedError();
    const absl::Status issued = NcclStatus(call.issue(comm_, stream_), call.what);
    if (!issued.ok()) return FailLocked(issued);
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (failed_) return EndedError();
      ncclResult_t state = ncclSuccess;
      absl::Status status =
          NcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (status.ok() && state != ncclInProgress) status = NcclStatus(state, call.what);
      if (!status.ok()) return FailLocked(status);
      if (state != ncclInProgress) return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(call.what, ": still being enqueued at the deadline")));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::StatusOr<std::shared_ptr<NcclOperation>> NcclCommunicator::Impl::Enqueue(
    absl::Time deadline, absl::Span<const NcclCall> calls) {
  if (ended_.load()) {
    absl::MutexLock lock(&mu_);
    return EndedError();
  }
  ZS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<NcclOperation> operation, NcclOperation::Create(deadline));
  cudaEvent_t ready;
  ZS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  absl::Status status =
      common::CudaStatus(cudaEventRecord(ready, compute_stream_), "cudaEventRecord");
  if (status.ok()) {
    status = common::CudaStatus(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
  }
  cudaEventDestroy(ready);
  ZS_RETURN_IF_ERROR(status);
  // After the wait for the compute stream, so the run time leaves out time queued behind it.
  ZS_CUDA_RETURN_IF_ERROR(cudaEventRecord(operation->start(), stream_));
  for (const NcclCall& call : calls) ZS_RETURN_IF_ERROR(IssueAndSettle(call, deadline));
  ZS_CUDA_RETURN_IF_ERROR(cudaEventRecord(operation->done(), stream_));
  return operation;
}

std::unique_ptr<Work> NcclCommunicator::Impl::Issue(const CollectiveOptions& options,
                                                    int64_t bytes_moved,
                                                    absl::Span<const NcclCall> calls) {
  absl::StatusOr<std::shared_ptr<NcclOperation>> operation =
      Enqueue(absl::Now() + options.timeout, calls);
  // Any failure to enqueue leaves the streams in an unknown state: it ends the communicator.
  if (!operation.ok()) return MakeFinishedWork(Fail(operation.status()));
  bytes_sent_.fetch_add(bytes_moved, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&watch_mu_);
    outstanding_.push_back(*operation);
  }
  return std::make_unique<NcclWork>(shared_from_this(), *std::move(operation));
}

void NcclCommunicator::Impl::WatchdogLoop() {
  // Events and NCCL belong to the communicator's device; this thread starts on device 0.
  cudaSetDevice(device_);
  std::vector<std::shared_ptr<NcclOperation>> watched;
  while (true) {
    {
      absl::MutexLock lock(&watch_mu_);
      watch_mu_.Await(absl::Condition(this, &Impl::WatchdogHasWork));
      if (stopping_) return;
      watched = outstanding_;
    }
    // Without watch_mu_: Poll may end the communicator, which takes mu_.
    for (const std::shared_ptr<NcclOperation>& operation : watched) Poll(*operation);
    watched.clear();
    absl::MutexLock lock(&watch_mu_);
    outstanding_.erase(std::remove_if(outstanding_.begin(), outstanding_.end(),
                                      [](const std::shared_ptr<NcclOperation>& operation) {
                                        return operation->finished();
                                      }),
                       outstanding_.end());
    if (watch_mu_.AwaitWithTimeout(absl::Condition(&stopping_), kWatchdogInterval)) return;
  }
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
  impl->StartWatchdog();
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
  const NcclCall call{[=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclReduceScatter(input, output, piece_count, nccl_type,
                                                 ToNcclOp(op), comm, stream);
                      },
                      "ncclReduceScatter"};
  return impl_->Issue(options, bytes, {call});
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
  const NcclCall call{[=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclAllGather(input, output, piece_count, nccl_type, comm, stream);
                      },
                      "ncclAllGather"};
  return impl_->Issue(options, bytes, {call});
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
  if (count % world != 0) {
    const NcclCall call{[=](ncclComm_t comm, cudaStream_t stream) {
                          return ncclAllReduce(buffer, buffer, count, nccl_type, ToNcclOp(op), comm,
                                               stream);
                        },
                        "ncclAllReduce"};
    return impl_->Issue(options, bytes, {call});
  }
  // The same reduce-scatter the zero modes run, then the all-gather: bitwise equal pieces.
  const size_t piece = count / world;
  char* bucket = static_cast<char*>(buffer);
  char* own = bucket + rank() * piece * element_size;
  const NcclCall calls[] = {
      {[=](ncclComm_t comm, cudaStream_t stream) {
         return ncclReduceScatter(bucket, own, piece, nccl_type, ToNcclOp(op), comm, stream);
       },
       "ncclReduceScatter"},
      {[=](ncclComm_t comm, cudaStream_t stream) {
         return ncclAllGather(own, bucket, piece, nccl_type, comm, stream);
       },
       "ncclAllGather"},
  };
  return impl_->Issue(options, bytes, calls);
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
  const NcclCall call{[=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclBroadcast(buffer, buffer, count, nccl_type, root, comm, stream);
                      },
                      "ncclBroadcast"};
  return impl_->Issue(options, bytes, {call});
}

std::unique_ptr<Work> NcclCommunicator::Barrier(const CollectiveOptions& options) {
  int32_t* word = impl_->barrier_word();
  const NcclCall call{[=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, stream);
                      },
                      "ncclAllReduce (barrier)"};
  return impl_->Issue(options, 0, {call});
}

void NcclCommunicator::Abort() { impl_->Abort(); }

CommunicatorStats NcclCommunicator::stats() const { return impl_->stats(); }

}  // namespace zeroshard::comm
