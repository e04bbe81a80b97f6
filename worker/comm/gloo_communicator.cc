// GlooCommunicator: rendezvous through our Store, a communication thread that runs operations in
// issue order on a GlooRing (gloo_ring.h), and the failure, timeout and abort handling around it.
#include "worker/comm/gloo_communicator.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/thread_affinity.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/gloo_link.h"
#include "worker/comm/gloo_mesh.h"
#include "worker/comm/gloo_ring.h"
#include "worker/comm/ring_schedule.h"
#include "worker/comm/routed_link.h"
#include "worker/comm/shm_link.h"

namespace zeroshard::comm {
namespace {

std::chrono::milliseconds ToGlooTimeout(absl::Duration remaining) {
  constexpr int64_t kLongestWaitMs = int64_t{24} * 3600 * 1000;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(remaining, absl::Milliseconds(1)));
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 1, kLongestWaitMs));
}

bool IsValidType(ElementType type) { return ElementSize(type) != 0; }

std::string ThisHost() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

enum class OperationKind { kReduceScatter, kAllGather, kAllReduce, kBroadcast, kBarrier };

absl::Status ValidateThreadOptions(const GlooCommunicatorOptions& options) {
  for (int cpu : options.thread_cpus) {
    if (!common::IsValidCpu(cpu)) {
      return absl::InvalidArgumentError(
          absl::StrCat("thread_cpus: ", cpu, " is not in [0, ", common::kCpuSetSize, ")"));
    }
  }
  if (options.thread_nice.has_value() &&
      (*options.thread_nice < -20 || *options.thread_nice > 19)) {
    return absl::InvalidArgumentError(
        absl::StrCat("thread_nice: ", *options.thread_nice, " is not in [-20, 19]"));
  }
  return absl::OkStatus();
}

// Applied by the communication thread to itself.
absl::Status ConfigureCurrentThread(const std::vector<int>& cpus, std::optional<int> nice) {
  if (!cpus.empty()) {
    const absl::Status pinned = common::PinCurrentThreadToCpus(cpus);
    if (!pinned.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("thread_cpus: pinning the communication thread failed: ", pinned.message()));
    }
  }
  if (nice.has_value()) {
    // On Linux the nice value is per thread: PRIO_PROCESS with a thread id sets that thread's.
    const pid_t thread_id = static_cast<pid_t>(syscall(SYS_gettid));
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(thread_id), *nice) != 0) {
      const int error = errno;
      const std::string message =
          absl::StrCat("thread_nice: setting the communication thread's nice value to ", *nice,
                       " failed: ", std::strerror(error));
      return error == EACCES || error == EPERM ? absl::PermissionDeniedError(message)
                                               : absl::InvalidArgumentError(message);
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* TransportName(Transport transport) {
  switch (transport) {
    case Transport::kTcp:
      return "tcp";
    case Transport::kShm:
      return "shm";
    case Transport::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<Transport> ParseTransport(absl::string_view name) {
  for (Transport transport : {Transport::kTcp, Transport::kShm, Transport::kAuto}) {
    if (name == TransportName(transport)) return transport;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("transport: '", name, "' is not one of auto, tcp, shm"));
}

// One issued operation. `input` is the out-of-place source (null when in place); `buffer` is the
// whole buffer the operation works on (for an out-of-place ReduceScatter, the output piece).
struct GlooCommunicator::Operation {
  OperationKind kind = OperationKind::kBarrier;
  const char* input = nullptr;
  char* buffer = nullptr;
  size_t count = 0;  // piece_count for ReduceScatter and AllGather, else the buffer's count
  ElementType type = ElementType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  CollectiveOptions options;
  uint64_t sequence = 0;
  std::shared_ptr<Completion> completion;
};

// The result of one operation, shared by its Work handle and the communication thread.
// Thread-safe.
class GlooCommunicator::Completion {
 public:
  // `run_time`: how long the operation ran on the communication thread (zero if it never ran).
  void Finish(absl::Status status, absl::Duration run_time) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    run_time_ = run_time;
    done_ = true;
  }

  absl::Status Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation still running after waiting ", absl::FormatDuration(timeout)));
    }
    return status_;
  }

  bool Done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  std::optional<absl::Duration> RunTime() const {
    absl::MutexLock lock(&mu_);
    if (!done_) return std::nullopt;
    return run_time_;
  }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Duration run_time_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooCommunicatorOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of world size ",
                                                   options.world_size, " is out of range"));
  }
  if (options.world_size > 1 && options.store == nullptr) {
    return absl::InvalidArgumentError("a store is required when world_size > 1");
  }
  if (options.segment_bytes < 64 || options.staging_segments < 1) {
    return absl::InvalidArgumentError("segment_bytes must be >= 64 and staging_segments >= 1");
  }
  if (options.lanes < 1 || options.lanes > kMaxLanes) {
    return absl::InvalidArgumentError(
        absl::StrCat("lanes: ", options.lanes, " is not in [1, ", kMaxLanes, "]"));
  }
  ZS_RETURN_IF_ERROR(ValidateThreadOptions(options));
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  std::unique_ptr<ShmLink> shm_link;
  std::unique_ptr<PeerWatch> peer_watch;
  if (options.world_size > 1) {
    const absl::Time deadline = absl::Now() + options.rendezvous_timeout;
    if (options.transport != Transport::kTcp) {
      ShmLinkOptions shm;
      shm.rank = options.rank;
      shm.world_size = options.world_size;
      shm.store = options.store;
      shm.store_prefix = options.store_prefix;
      shm.host = options.host.empty() ? ThisHost() : options.host;
      shm.slot_bytes = options.shm_slot_bytes;
      shm.slots = options.shm_slots;
      shm.deadline = deadline;
      shm.abort_signal = options.abort_signal;
      // Under auto, the ranks of each host share memory among themselves.
      shm.whole_group = options.transport == Transport::kShm;
      absl::StatusOr<std::unique_ptr<ShmLink>> connected = ShmLink::Connect(shm);
      if (connected.ok()) {
        shm_link = *std::move(connected);
      } else if (!absl::IsFailedPrecondition(connected.status()) ||
                 options.transport == Transport::kShm) {
        // Every rank of a host got the same FAILED_PRECONDITION, so under auto they all fall back
        // to TCP together.
        return absl::Status(connected.status().code(),
                            absl::StrCat("transport=", TransportName(options.transport), ": ",
                                         connected.status().message()));
      }
    }
    GlooMeshOptions mesh;
    mesh.rank = options.rank;
    mesh.world_size = options.world_size;
    mesh.lanes = options.lanes;
    mesh.store = options.store;
    mesh.store_prefix = options.store_prefix;
    mesh.hostname = options.hostname;
    mesh.deadline = deadline;
    mesh.abort_signal = options.abort_signal;
    // When shared memory carries every message, no Gloo mesh (nor its event-loop threads) is
    // needed.
    if (shm_link == nullptr || !shm_link->reaches_all()) {
      ZS_ASSIGN_OR_RETURN(contexts, ConnectGlooMeshes(mesh));
    }
    PeerWatchOptions watch;
    watch.rank = options.rank;
    watch.world_size = options.world_size;
    watch.store = options.store;
    watch.store_prefix = options.store_prefix;
    watch.hostname = options.hostname;
    watch.deadline = mesh.deadline;
    watch.abort_signal = options.abort_signal;
    ZS_ASSIGN_OR_RETURN(peer_watch, PeerWatch::Connect(watch));
  }
  std::unique_ptr<GlooCommunicator> communicator(new GlooCommunicator(
      options, std::move(contexts), std::move(shm_link), std::move(peer_watch)));
  ZS_RETURN_IF_ERROR(communicator->AwaitThreadSetup());
  if (communicator->peer_watch_ != nullptr) {
    communicator->peer_watch_->Start(
        [raw = communicator.get()](absl::Status why) { raw->Fail(std::move(why)); });
  }
  return communicator;
}

GlooCommunicator::GlooCommunicator(const GlooCommunicatorOptions& options,
                                   std::vector<std::shared_ptr<gloo::Context>> contexts,
                                   std::unique_ptr<ShmLink> shm_link,
                                   std::unique_ptr<PeerWatch> peer_watch)
    : rank_(options.rank),
      world_size_(options.world_size),
      segment_bytes_(options.segment_bytes),
      staging_segments_(options.staging_segments),
      contexts_(std::move(contexts)),
      shm_link_(std::move(shm_link)),
      peer_watch_(std::move(peer_watch)) {
  {
    absl::MutexLock lock(&mu_);
    connections_open_ = !contexts_.empty() || shm_link_ != nullptr;
  }
  if (shm_link_ != nullptr)
    scratch_bytes_.store(shm_link_->ring_bytes(), std::memory_order_relaxed);
  thread_ = std::thread([this, cpus = options.thread_cpus, nice = options.thread_nice] {
    CommunicationLoop(cpus, nice);
  });
  thread_clock_readable_ = pthread_getcpuclockid(thread_.native_handle(), &thread_clock_) == 0;
}

absl::Status GlooCommunicator::AwaitThreadSetup() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&thread_set_up_));
  return thread_setup_;
}

GlooCommunicator::~GlooCommunicator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  bool busy;
  {
    absl::MutexLock lock(&mu_);
    busy = !queue_.empty() || running_;
  }
  if (busy) Abort();
  thread_.join();
  bool failed;
  {
    absl::MutexLock lock(&mu_);
    failed = failed_;
  }
  // Before the Gloo connections close: a peer reads the farewell, then sees the end.
  if (peer_watch_ != nullptr) {
    peer_watch_->Stop(failed ? PeerWatch::Parting::kLeaving : PeerWatch::Parting::kFarewell);
  }
  // Graceful close: data already written still reaches the peers.
  contexts_.clear();
}

bool GlooCommunicator::HasThreadWork() const {
  return !queue_.empty() || stopping_ || (failed_ && connections_open_);
}

void GlooCommunicator::CommunicationLoop(std::vector<int> cpus, std::optional<int> nice) {
  {
    absl::Status setup = ConfigureCurrentThread(cpus, nice);
    absl::MutexLock lock(&mu_);
    thread_setup_ = std::move(setup);
    thread_set_up_ = true;
  }
  while (true) {
    std::optional<Operation> operation;
    bool failed;
    absl::Status failure;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &GlooCommunicator::HasThreadWork));
      if (!queue_.empty()) {
        operation = std::move(queue_.front());
        queue_.pop_front();
      }
      failed = failed_;
      running_ = operation.has_value() && !failed;
      failure = failure_;
      if (!operation.has_value() && !failed && stopping_) return;
    }
    if (failed) {
      CloseConnections();
      if (operation.has_value()) {
        operation->completion->Finish(
            absl::AbortedError(
                absl::StrCat("communicator ended before this operation ran: ", failure.ToString())),
            absl::ZeroDuration());
      } else {
        absl::MutexLock lock(&mu_);
        if (stopping_ && queue_.empty()) return;
      }
      continue;
    }
    absl::Status status;
    const absl::Time run_start = absl::Now();
    {
      // Gloo's buffers are per operation; the shared-memory link lives as long as this object.
      std::optional<GlooLink> gloo_link;
      std::optional<RoutedLink> routed_link;
      RingLink* link = shm_link_.get();
      if (!contexts_.empty()) {
        gloo_link.emplace(
            rank_, &contexts_,
            [this](gloo::transport::UnboundBuffer* buffer, bool receive, absl::Time deadline) {
              return WaitOnBuffer(buffer, receive, deadline);
            });
        link = &*gloo_link;
        if (shm_link_ != nullptr) link = &routed_link.emplace(shm_link_.get(), &*gloo_link);
      }
      GlooRing ring(RingEnvironment(link), operation->options.tag, operation->sequence,
                    absl::Now() + operation->options.timeout);
      status = Execute(*operation, ring);
      if (!status.ok()) {
        MarkFailed(status);
        // Close before the ring's buffers go away, so Gloo never writes into freed memory.
        CloseConnections();
      }
    }
    const absl::Duration run_time = absl::Now() - run_start;
    {
      absl::MutexLock lock(&mu_);
      running_ = false;
    }
    // Before Finish, so an owner that saw the operation complete reads the grown buffers.
    scratch_bytes_.store(static_cast<int64_t>(staging_.capacity() + scratch_.capacity()) +
                             (shm_link_ != nullptr ? shm_link_->ring_bytes() : 0),
                         std::memory_order_relaxed);
    operations_completed_.fetch_add(1, std::memory_order_relaxed);
    operation->completion->Finish(std::move(status), run_time);
  }
}

GlooRingEnvironment GlooCommunicator::RingEnvironment(RingLink* link) {
  GlooRingEnvironment environment;
  environment.rank = rank_;
  environment.world_size = world_size_;
  environment.segment_bytes = segment_bytes_;
  environment.staging_segments = staging_segments_;
  environment.link = link;
  environment.staging = &staging_;
  environment.bytes_sent = &bytes_sent_;
  environment.bytes_received = &bytes_received_;
  return environment;
}

absl::Status GlooCommunicator::Execute(const Operation& operation, GlooRing& ring) {
  try {
    switch (operation.kind) {
      case OperationKind::kReduceScatter:
        return RunReduceScatter(operation, ring);
      case OperationKind::kAllGather:
        return RunAllGather(operation, ring);
      case OperationKind::kAllReduce:
        return RunAllReduce(operation, ring);
      case OperationKind::kBroadcast:
        return RunBroadcast(operation, ring);
      case OperationKind::kBarrier:
        return RunBarrier(ring);
    }
    return absl::InternalError("unknown operation kind");
  } catch (const std::exception& e) {
    const std::string message =
        absl::StrCat("gloo collective (sequence ", operation.sequence, ") failed: ", e.what());
    if (absl::Now() >= ring.deadline()) {
      return absl::DeadlineExceededError(absl::StrCat(
          message, " (timeout ", absl::FormatDuration(operation.options.timeout), ")"));
    }
    if (std::optional<absl::Status> watched = AwaitWatchedFailure(); watched.has_value()) {
      return absl::Status(watched->code(), absl::StrCat(watched->message(), "; ", message));
    }
    return absl::UnavailableError(message);
  }
}

std::optional<absl::Status> GlooCommunicator::AwaitWatchedFailure() {
  if (peer_watch_ == nullptr) return std::nullopt;
  // Gloo may see a killed peer's connection close a moment before the PeerWatch sees its own:
  // a short grace lets the failure name the peer that was lost (or left) instead of a socket.
  constexpr absl::Duration kGrace = absl::Milliseconds(250);
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&failed_), kGrace)) return std::nullopt;
  return failure_;
}

void GlooCommunicator::MarkFailed(const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (failed_) return;
  failed_ = true;
  failure_ = cause;
}

void GlooCommunicator::CloseConnections() {
  // First, so that the peers learn of the failure at once (their collectives may be waiting on
  // a message this rank will never send).
  if (peer_watch_ != nullptr) peer_watch_->Stop(PeerWatch::Parting::kLeaving);
  // Drops the failed operation's unpushed sends before its buffers go away (the pusher thread of
  // a group spanning hosts would read them). No operation reaches the link after this, so the
  // status is never reported; Fail's, when it came first, stays.
  if (shm_link_ != nullptr) shm_link_->Interrupt(absl::AbortedError("communicator closed"));
  for (const std::shared_ptr<gloo::Context>& context : contexts_) {
    try {
      context->closeConnections();
    } catch (const std::exception&) {
      // The connections are being torn down because of an earlier error; a further error while
      // closing them changes nothing.
    }
  }
  absl::MutexLock lock(&mu_);
  connections_open_ = false;
}

absl::Status GlooCommunicator::WaitOnBuffer(gloo::transport::UnboundBuffer* buffer, bool receive,
                                            absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return absl::AbortedError(failure_.message());
    waiting_on_ = buffer;
  }
  absl::Cleanup clear_waiting = [this] {
    absl::MutexLock lock(&mu_);
    waiting_on_ = nullptr;
  };
  const absl::Duration remaining = deadline - absl::Now();
  if (remaining <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError("collective timed out");
  }
  const std::chrono::milliseconds timeout = ToGlooTimeout(remaining);
  const bool completed =
      receive ? buffer->waitRecv(nullptr, timeout) : buffer->waitSend(nullptr, timeout);
  if (!completed) {
    absl::MutexLock lock(&mu_);
    if (!failed_) return absl::AbortedError("gloo wait aborted");
    // A lost peer keeps its UNAVAILABLE (the operation failed, nobody aborted it).
    return absl::IsAborted(failure_) ? absl::AbortedError(failure_.message()) : failure_;
  }
  return absl::OkStatus();
}

Transport GlooCommunicator::transport() const {
  return shm_link_ != nullptr && shm_link_->reaches_all() ? Transport::kShm : Transport::kTcp;
}

std::vector<int> GlooCommunicator::SharedMemoryPeers() const {
  std::vector<int> peers;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (shm_link_ != nullptr && shm_link_->reaches(peer)) peers.push_back(peer);
  }
  return peers;
}

void GlooCommunicator::Abort() { Fail(absl::AbortedError("communicator aborted")); }

std::vector<int> GlooCommunicator::LostPeers() const {
  return peer_watch_ != nullptr ? peer_watch_->lost_ranks() : std::vector<int>();
}

void GlooCommunicator::Fail(absl::Status cause) {
  absl::MutexLock lock(&mu_);
  if (!failed_) {
    failed_ = true;
    failure_ = std::move(cause);
  }
  if (waiting_on_ != nullptr) {
    waiting_on_->abortWaitRecv();
    waiting_on_->abortWaitSend();
  }
  // As WaitOnBuffer reports it: a lost peer keeps its UNAVAILABLE, anything else is ABORTED.
  if (shm_link_ != nullptr) {
    shm_link_->Interrupt(absl::IsAborted(failure_) || failure_.ok()
                             ? absl::AbortedError(failure_.message())
                             : failure_);
  }
}

CommunicatorStats GlooCommunicator::stats() const {
  CommunicatorStats stats;
  stats.operations_completed = operations_completed_.load(std::memory_order_relaxed);
  stats.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  stats.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  stats.scratch_bytes = scratch_bytes_.load(std::memory_order_relaxed);
  timespec cpu_time;
  if (thread_clock_readable_ && clock_gettime(thread_clock_, &cpu_time) == 0) {
    stats.thread_cpu_ns = int64_t{cpu_time.tv_sec} * 1000000000 + cpu_time.tv_nsec;
  }
  return stats;
}

std::unique_ptr<Work> GlooCommunicator::Enqueue(Operation operation) {
  if (!IsValidType(operation.type)) {
    return MakeFinishedWork(absl::InvalidArgumentError("invalid element type"));
  }
  if (operation.options.timeout <= absl::ZeroDuration()) {
    return MakeFinishedWork(absl::InvalidArgumentError("timeout must be positive"));
  }
  const size_t element_size = ElementSize(operation.type);
  if (operation.count > std::numeric_limits<size_t>::max() / element_size / world_size_) {
    return MakeFinishedWork(absl::InvalidArgumentError("element count overflows"));
  }
  if (operation.count > 0 && operation.buffer == nullptr) {
    return MakeFinishedWork(absl::InvalidArgumentError("null buffer with a nonzero count"));
  }
  auto completion = std::make_shared<Completion>();
  operation.completion = completion;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) {
      return MakeFinishedWork(
          absl::AbortedError(absl::StrCat("communicator ended: ", failure_.ToString())));
    }
    operation.sequence = next_sequence_++;
    queue_.push_back(std::move(operation));
  }
  class CompletionWork : public Work {
   public:
    explicit CompletionWork(std::shared_ptr<Completion> completion)
        : completion_(std::move(completion)) {}
    absl::Status Wait(absl::Duration timeout) override { return completion_->Wait(timeout); }
    bool Done() const override { return completion_->Done(); }
    std::optional<absl::Duration> RunTime() const override { return completion_->RunTime(); }

   private:
    const std::shared_ptr<Completion> completion_;
  };
  return std::make_unique<CompletionWork>(std::move(completion));
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatter(const void* input, void* output,
                                                      size_t piece_count, ElementType type,
                                                      ReduceOp op,
                                                      const CollectiveOptions& options) {
  if (piece_count > 0 && input == nullptr) {
    return MakeFinishedWork(absl::InvalidArgumentError("null input with a nonzero count"));
  }
  Operation operation;
  operation.kind = OperationKind::kReduceScatter;
  operation.input = static_cast<const char*>(input);
  operation.buffer = static_cast<char*>(output);
  operation.count = piece_count;
  operation.type = type;
  operation.reduce = op;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatterInPlace(void* buffer, size_t piece_count,
                                                             ElementType type, ReduceOp op,
                                                             const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kReduceScatter;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = piece_count;
  operation.type = type;
  operation.reduce = op;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::AllGather(const void* input, void* output,
                                                  size_t piece_count, ElementType type,
                                                  const CollectiveOptions& options) {
  if (piece_count > 0 && input == nullptr) {
    return MakeFinishedWork(absl::InvalidArgumentError("null input with a nonzero count"));
  }
  Operation operation;
  operation.kind = OperationKind::kAllGather;
  operation.input = static_cast<const char*>(input);
  operation.buffer = static_cast<char*>(output);
  operation.count = piece_count;
  operation.type = type;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::AllGatherInPlace(void* buffer, size_t piece_count,
                                                         ElementType type,
                                                         const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kAllGather;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = piece_count;
  operation.type = type;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::AllReduce(void* buffer, size_t count, ElementType type,
                                                  ReduceOp op, const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kAllReduce;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = count;
  operation.type = type;
  operation.reduce = op;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::Broadcast(void* buffer, size_t count, ElementType type,
                                                  int root, const CollectiveOptions& options) {
  if (root < 0 || root >= world_size_) {
    return MakeFinishedWork(absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside world size ", world_size_)));
  }
  Operation operation;
  operation.kind = OperationKind::kBroadcast;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = count;
  operation.type = type;
  operation.root = root;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::Barrier(const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kBarrier;
  operation.options = options;
  return Enqueue(std::move(operation));
}

absl::Status GlooCommunicator::RunReduceScatter(const Operation& operation, GlooRing& ring) {
  const size_t piece_bytes = operation.count * ElementSize(operation.type);
  if (piece_bytes == 0) return absl::OkStatus();
  const bool in_place = operation.input == nullptr;
  const char* input = in_place ? operation.buffer : operation.input;
  char* output = in_place ? operation.buffer + rank_ * piece_bytes : operation.buffer;
  if (world_size_ == 1) {
    if (!in_place) std::memcpy(output, input, piece_bytes);
    return absl::OkStatus();
  }
  char* work = operation.buffer;
  if (!in_place) {
    if (scratch_.size() < world_size_ * piece_bytes) scratch_.resize(world_size_ * piece_bytes);
    work = scratch_.data();
  }
  return ring.ReduceScatter(EqualPieces(world_size_, operation.count), input, work, output,
                            operation.type, operation.reduce, /*unit_base=*/0);
}

absl::Status GlooCommunicator::RunAllGather(const Operation& operation, GlooRing& ring) {
  const size_t piece_bytes = operation.count * ElementSize(operation.type);
  if (piece_bytes == 0) return absl::OkStatus();
  if (operation.input != nullptr) {
    std::memcpy(operation.buffer + rank_ * piece_bytes, operation.input, piece_bytes);
  }
  if (world_size_ == 1) return absl::OkStatus();
  return ring.AllGather(EqualPieces(world_size_, operation.count), operation.buffer,
                        ElementSize(operation.type), /*unit_base=*/0);
}

absl::Status GlooCommunicator::RunAllReduce(const Operation& operation, GlooRing& ring) {
  if (operation.count == 0 || world_size_ == 1) return absl::OkStatus();
  const size_t element_size = ElementSize(operation.type);
  const Pieces pieces = BalancedPieces(world_size_, operation.count);
  char* buffer = operation.buffer;
  ZS_RETURN_IF_ERROR(ring.ReduceScatter(pieces, buffer, buffer,
                                        buffer + pieces.begin[rank_] * element_size, operation.type,
                                        operation.reduce, /*unit_base=*/0));
  return ring.AllGather(pieces, buffer, element_size, /*unit_base=*/kUnitsPerPhase);
}

absl::Status GlooCommunicator::RunBroadcast(const Operation& operation, GlooRing& ring) {
  if (operation.count == 0 || world_size_ == 1) return absl::OkStatus();
  return ring.Broadcast(operation.buffer, operation.count, ElementSize(operation.type),
                        operation.root);
}

absl::Status GlooCommunicator::RunBarrier(GlooRing& ring) {
  if (world_size_ == 1) return absl::OkStatus();
  return ring.Barrier();
}

}  // namespace zeroshard::comm
