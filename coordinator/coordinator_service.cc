// The Coordinator service's gRPC handlers.
#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/export.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/checkpoint_verification.h"
#include "coordinator/ids.h"
#include "coordinator/queries.h"
#include "coordinator/request_parsing.h"
#include "coordinator/request_validation.h"
#include "security/authenticator.h"
#include "security/metadata.h"

namespace zeroshard::coordinator {
namespace {

// The `zeroshard-worker-secret` metadata of the call; empty when there is none.
std::string WorkerSecretOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(security::kWorkerSecretKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// A StoreGet call parked in the rendezvous store. Finishes exactly once (the store calls back
// exactly once); a client that goes away cancels its wait.
class StoreGetReactor final : public grpc::ServerUnaryReactor {
 public:
  StoreGetReactor(RendezvousStore* store, CoordinatorMetrics* metrics, absl::Time start)
      : store_(store), metrics_(metrics), start_(start) {}

  // `response` receives the serialized StoreGetResponse before the call finishes.
  void Park(const v1::StoreGetRequest& request, grpc::ByteBuffer* response) {
    const RendezvousStore::WaiterId id =
        store_->Get(request.job_id(), request.generation(), request.key(),
                    absl::Milliseconds(request.timeout_ms()),
                    [this, response](absl::StatusOr<std::string> value) {
                      absl::Status status = value.status();
                      if (value.ok()) {
                        v1::StoreGetResponse found;
                        found.set_value(*std::move(value));
                        status = SerializeResponse(found, response);
                      }
                      metrics_->RecordRpc("StoreGet", status.code(), absl::Now() - start_);
                      Finish(common::ToGrpcStatus(status));
                    });
    waiter_.store(id);
    if (cancelled_.load()) store_->CancelWait(id);
  }

  void OnCancel() override {
    cancelled_.store(true);
    if (const RendezvousStore::WaiterId id = waiter_.load(); id != 0) store_->CancelWait(id);
  }

  void OnDone() override { delete this; }

 private:
  RendezvousStore* const store_;
  CoordinatorMetrics* const metrics_;
  const absl::Time start_;
  std::atomic<RendezvousStore::WaiterId> waiter_{0};
  std::atomic<bool> cancelled_{false};
};

class WatchReactor;

// The manager's handle on one WatchJob stream. First it reads the history from the manager a
// page at a time, the next page once the last one is written, so a history of any length costs
// one page of memory; the last page makes it follow the job (JobManager::WatchPage). Never
// blocks: events queue here and the reactor writes them one at a time; a full queue ends the
// stream (the watcher fell behind live events).
// Thread-safe. StartWrite and Finish are called with mu_ held: gRPC never runs a reaction inline
// with the call that starts the operation, so this cannot re-enter. mu_ is never held while
// calling the manager, which calls OnEvent and OnJobEnded with its own lock held.
class WatchSink final : public JobEventSink, public std::enable_shared_from_this<WatchSink> {
 public:
  WatchSink(WatchReactor* reactor, JobManager* manager, std::string job_id, size_t max_backlog,
            size_t page_events)
      : reactor_(reactor),
        manager_(manager),
        job_id_(std::move(job_id)),
        max_backlog_(max_backlog),
        page_events_(std::max<size_t>(1, std::min(page_events, max_backlog))) {}

  // Sends the history after `after_sequence`, then follows the job.
  void Start(int64_t after_sequence);
  bool OnEvent(const v1::JobEvent& event) override;
  void OnJobEnded() override;
  // The reactor finished writing the front event.
  void OnWriteDone(bool ok);
  // The client went away.
  void OnCancel();
  // The credential the stream was opened with was revoked: ends it UNAUTHENTICATED (once; not
  // after it ended).
  void Revoke();
  // The reactor is about to be deleted.
  void Detach();

 private:
  // Reads history pages while the queue is empty, until the sink follows the job, its stream
  // has finished, or another call is reading one.
  void ReadHistory() ABSL_LOCKS_EXCLUDED(mu_);
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Null once the reactor is done.
  WatchReactor* reactor_ ABSL_GUARDED_BY(mu_);
  JobManager* const manager_;
  const std::string job_id_;
  const size_t max_backlog_;
  const size_t page_events_;
  // The sequence of the last event queued: the next page starts after it.
  int64_t last_queued_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // A page is being read (on one thread at a time: two would send events twice).
  bool reading_page_ ABSL_GUARDED_BY(mu_) = false;
  // The manager sends every new event; no more pages are read.
  bool following_ ABSL_GUARDED_BY(mu_) = false;
  // Events not yet written, serialized; the front one is being written while `writing_`.
  struct QueuedEvent {
    int64_t sequence;
    grpc::ByteBuffer bytes;
  };
  std::deque<QueuedEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool job_ended_ ABSL_GUARDED_BY(mu_) = false;
  // Finish was called: nothing more is written.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_written_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

// Writes serialized JobEvents: the method is registered raw (see CoordinatorServiceBase).
class WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(JobManager* manager, std::string job_id, size_t max_backlog, size_t page_events)
      : manager_(manager),
        job_id_(job_id),
        sink_(std::make_shared<WatchSink>(this, manager, std::move(job_id), max_backlog,
                                          page_events)) {}

  std::shared_ptr<WatchSink> sink() { return sink_; }
  // `released` runs once the stream is done; set before the stream starts.
  void set_released(std::function<void()> released) { released_ = std::move(released); }
  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }
  void OnDone() override {
    sink_->Detach();
    // A cancelled watch of a quiet job would otherwise stay in the manager until its next event.
    manager_->Unwatch(job_id_, sink_.get());
    if (released_) released_();
    delete this;
  }

 private:
  JobManager* const manager_;
  const std::string job_id_;
  std::shared_ptr<WatchSink> sink_;
  std::function<void()> released_;
};

void WatchSink::Start(int64_t after_sequence) {
  {
    absl::MutexLock lock(&mu_);
    last_queued_sequence_ = after_sequence;
  }
  ReadHistory();
}

void WatchSink::ReadHistory() {
  // The manager holds the sink only once it follows; until then this call keeps it alive.
  const std::shared_ptr<WatchSink> self = shared_from_this();
  while (true) {
    int64_t after_sequence;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || following_ || reading_page_ || writing_) return;
      reading_page_ = true;
      after_sequence = last_queued_sequence_;
    }
    // The page's events arrive through OnEvent (and start writing) before this returns.
    absl::StatusOr<JobManager::WatchPosition> position =
        manager_->WatchPage(job_id_, after_sequence, static_cast<int64_t>(page_events_), self);
    absl::MutexLock lock(&mu_);
    reading_page_ = false;
    if (!position.ok()) {
      if (!finished_) FinishLocked(common::ToGrpcStatus(position.status()));
      return;
    }
    following_ = position->following;
  }
}

bool WatchSink::OnEvent(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  if (finished_) return false;
  if (queue_.size() >= max_backlog_) {
    FinishLocked(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("watch: the watcher fell behind by ", queue_.size(),
                     " events; reconnect with after_sequence=", last_written_sequence_)));
    return false;
  }
  QueuedEvent queued{event.sequence(), grpc::ByteBuffer()};
  if (absl::Status serialized = SerializeResponse(event, &queued.bytes); !serialized.ok()) {
    FinishLocked(common::ToGrpcStatus(serialized));
    return false;
  }
  queue_.push_back(std::move(queued));
  last_queued_sequence_ = event.sequence();
  if (!writing_) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front().bytes);
  }
  return true;
}

void WatchSink::OnJobEnded() {
  absl::MutexLock lock(&mu_);
  job_ended_ = true;
  if (!writing_ && !finished_) FinishLocked(grpc::Status::OK);
}

void WatchSink::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch: write failed"));
      return;
    }
    last_written_sequence_ = queue_.front().sequence;
    queue_.pop_front();
    if (!queue_.empty()) {
      reactor_->StartWrite(&queue_.front().bytes);
      return;
    }
    writing_ = false;
    if (job_ended_) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    if (following_) return;
  }
  ReadHistory();
}

void WatchSink::OnCancel() {
  absl::MutexLock lock(&mu_);
  if (!finished_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch: cancelled"));
}

void WatchSink::Revoke() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  FinishLocked(grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      absl::StrCat("watch: token revoked: the token (or client certificate) this stream was opened "
                   "with left the coordinator's token file, or now names another identity or "
                   "role, at its reload (SIGHUP); watch again with a current token and "
                   "after_sequence=",
                   last_written_sequence_)));
}

void WatchSink::Detach() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  reactor_ = nullptr;
  queue_.clear();
}

void WatchSink::FinishLocked(const grpc::Status& status) {
  finished_ = true;
  if (reactor_ != nullptr) reactor_->Finish(status);
}

// Bytes per ExportCheckpointChunk (the last one may be shorter).
constexpr size_t kExportChunkBytes = checkpoint::kDefaultExportChunkBytes;
// Chunks queued at most, the one being written included: the next chunk is ready when a write
// completes, and a client that does not read holds no more than this.
constexpr size_t kMaxQueuedExportChunks = 2;

// One ExportCheckpoint stream. A thread of its own finds the checkpoint, reads it and cuts the
// exported file into chunks; the reactor writes one chunk at a time. The thread waits while the
// queue is full, so the client's pace sets the reading's; once the client goes away (or a write
// fails) its next chunk ends the reading. The call finishes only after the thread has ended and no
// write is in flight, so OnDone's join does not wait.
// Thread contract: the reading thread and gRPC's reactions meet under mu_. StartWrite and Finish
// are called with mu_ held: gRPC never runs a reaction inline with the call that starts the
// operation, so this cannot re-enter.
// Writes serialized ExportCheckpointChunks: the method is registered raw.
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `reading_ended` runs on the thread once it stops reading (before the call finishes);
  // `waits_for_testing` as ServiceOptions::export_waits_for_testing.
  ExportReactor(JobManager* manager, CoordinatorMetrics* metrics,
                std::function<void()> reading_ended, std::function<void(int64_t)> waits_for_testing)
      : manager_(manager),
        metrics_(metrics),
        reading_ended_(std::move(reading_ended)),
        waits_for_testing_(std::move(waits_for_testing)),
        start_(absl::Now()) {}

  void Start(std::string job_id, std::optional<int64_t> step) {
    absl::MutexLock lock(&mu_);
    thread_ = std::thread([this, job_id = std::move(job_id), step] {
      const absl::Status status = Read(job_id, step);
      reading_ended_();
      absl::MutexLock lock(&mu_);
      read_status_ = status;
      read_done_ = true;
      FinishIfDoneLocked();
    });
  }

  // Ends a call that reads nothing (a refused request).
  void Refuse(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    read_status_ = status;
    read_done_ = true;
    FinishIfDoneLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (!ok) gone_ = true;
    if (!gone_ && !queue_.empty()) {
      StartWrite(&queue_.front());
      return;
    }
    writing_ = false;
    queue_.clear();
    FinishIfDoneLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    gone_ = true;
    FinishIfDoneLocked();
  }

  void OnDone() override {
    // Nothing reaches this reactor through its handle from now on.
    {
      absl::MutexLock lock(&handle_->mu);
      handle_->reactor = nullptr;
    }
    // Start() assigns thread_ under mu_.
    { absl::MutexLock lock(&mu_); }
    if (thread_.joinable()) thread_.join();
    if (done_) done_();
    delete this;
  }

  // The credential the stream was opened with was revoked: it stops reading and ends
  // UNAUTHENTICATED (once the write in flight, if any, is done; not after it ended).
  void Revoke() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    revoked_ = true;
    gone_ = true;
    FinishIfDoneLocked();
  }

  // How a token reload reaches this reactor while it lives (OnDone detaches it first).
  struct Handle {
    absl::Mutex mu;
    ExportReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<Handle> handle() const { return handle_; }
  // Runs in OnDone, before the reactor is deleted. Set before Start().
  void set_done(std::function<void()> done) { done_ = std::move(done); }

 private:
  // The thread's work: everything but the writes.
  absl::Status Read(const std::string& job_id, std::optional<int64_t> step) {
    ZS_ASSIGN_OR_RETURN(ExportSource source, manager_->FindExportCheckpoint(job_id, step));
    // Every file whole against the manifest's size and CRC32C first: a damaged checkpoint
    // exports nothing (DATA_LOSS naming the file), even where its fragments would still read.
    ZS_RETURN_IF_ERROR(FirstDamagedFile(checkpoint::VerifyCheckpoint(source.checkpoint)));
    ZS_ASSIGN_OR_RETURN(const std::unique_ptr<checkpoint::CheckpointReader> reader,
                        checkpoint::CheckpointReader::Open(std::move(source.checkpoint)));
    ZS_ASSIGN_OR_RETURN(
        const checkpoint::CheckpointExport file,
        checkpoint::CheckpointExport::Create(reader.get(), source.is_final, source.aliases));
    v1::ExportCheckpointChunk chunk;
    chunk.set_step(file.step());
    chunk.set_final_state(source.is_final);
    chunk.set_total_bytes(static_cast<int64_t>(file.total_bytes()));
    chunk.set_tensor_count(static_cast<int32_t>(file.tensors().size()));
    chunk.mutable_data()->reserve(kExportChunkBytes);
    ZS_RETURN_IF_ERROR(file.Stream(
        [&](const void* data, size_t n) -> absl::Status {
          const char* bytes = static_cast<const char*>(data);
          while (n > 0) {
            const size_t take = std::min(n, kExportChunkBytes - chunk.data().size());
            chunk.mutable_data()->append(bytes, take);
            bytes += take;
            n -= take;
            if (chunk.data().size() == kExportChunkBytes) {
              ZS_RETURN_IF_ERROR(Push(chunk));
              chunk = v1::ExportCheckpointChunk();
              chunk.mutable_data()->reserve(kExportChunkBytes);
            }
          }
          return absl::OkStatus();
        },
        kExportChunkBytes));
    if (!chunk.data().empty()) ZS_RETURN_IF_ERROR(Push(chunk));
    return absl::OkStatus();
  }

  // Queues a chunk once there is room. CANCELLED when the client is gone.
  absl::Status Push(const v1::ExportCheckpointChunk& chunk) {
    grpc::ByteBuffer serialized;
    ZS_RETURN_IF_ERROR(SerializeResponse(chunk, &serialized));
    absl::MutexLock lock(&mu_);
    if (!RoomOrGoneLocked() && waits_for_testing_) waits_for_testing_(bytes_queued_);
    mu_.Await(absl::Condition(this, &ExportReactor::RoomOrGoneLocked));
    if (gone_) return absl::CancelledError("export: the client went away");
    bytes_queued_ += static_cast<int64_t>(chunk.data().size());
    queue_.push_back(std::move(serialized));
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
    return absl::OkStatus();
  }

  bool RoomOrGoneLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return gone_ || queue_.size() < kMaxQueuedExportChunks;
  }

  void FinishIfDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !read_done_ || writing_) return;
    finished_ = true;
    const absl::Status status =
        revoked_ ? absl::UnauthenticatedError(
                       "export: token revoked: the token (or client certificate) this stream was "
                       "opened with left the coordinator's token file, or now names another "
                       "identity or role, at its reload (SIGHUP); export again with a current "
                       "token")
        : gone_ ? absl::CancelledError("export: the client went away")
                : read_status_;
    metrics_->RecordRpc("ExportCheckpoint", status.code(), absl::Now() - start_);
    Finish(common::ToGrpcStatus(status));
  }

  JobManager* const manager_;
  CoordinatorMetrics* const metrics_;
  const std::function<void()> reading_ended_;
  const std::function<void(int64_t)> waits_for_testing_;
  const absl::Time start_;
  // Assigned by Start() under mu_, joined by OnDone().
  std::thread thread_;

  mutable absl::Mutex mu_;
  // Chunks not yet written; the front one is being written while `writing_`. A deque keeps it in
  // place while more are queued behind it.
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t bytes_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // The client went away or a write failed: nothing more is written.
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  // The thread has ended (or never started) with `read_status_`.
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status read_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Its credential was revoked (Revoke): it ends UNAUTHENTICATED.
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  const std::shared_ptr<Handle> handle_ = [this] {
    auto handle = std::make_shared<Handle>();
    absl::MutexLock lock(&handle->mu);
    handle->reactor = this;
    return handle;
  }();
  std::function<void()> done_;
};

// One VerifyCheckpoint call. A thread of its own finds the checkpoint and reads every file of it
// whole (JobManager::FindCommittedCheckpoint, VerifyCommittedCheckpoint), then finishes the call;
// OnDone joins it. The reading runs to its end even when the client goes away (it is bounded by
// the checkpoint's size), so the server's shutdown waits for it.
// Thread contract: Start() assigns thread_ under mu_, and the thread finishes the call under
// mu_, so OnDone (which takes mu_ first) never sees thread_ unassigned. Refuse() finishes a call
// that starts no thread.
// Writes a serialized VerifyCheckpointResponse into the raw response: the method is registered
// raw.
class VerifyReactor final : public grpc::ServerUnaryReactor {
 public:
  // `reading_ended` runs on the thread once it stops reading (before the call finishes).
  VerifyReactor(JobManager* manager, CoordinatorMetrics* metrics, int max_send_message_bytes,
                grpc::ByteBuffer* response, std::function<void()> reading_ended, absl::Time start)
      : manager_(manager),
        metrics_(metrics),
        max_send_message_bytes_(max_send_message_bytes),
        response_(response),
        reading_ended_(std::move(reading_ended)),
        start_(start) {}

  void Start(std::string job_id, std::optional<int64_t> step) {
    absl::MutexLock lock(&mu_);
    thread_ = std::thread([this, job_id = std::move(job_id), step] {
      const absl::Status status = Verify(job_id, step);
      reading_ended_();
      absl::MutexLock lock(&mu_);
      FinishWith(status);
    });
  }

  void Refuse(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishWith(status);
  }

  void OnDone() override {
    { absl::MutexLock lock(&mu_); }
    if (thread_.joinable()) thread_.join();
    delete this;
  }

 private:
  // The thread's work: the reply, serialized into response_.
  absl::Status Verify(const std::string& job_id, std::optional<int64_t> step) {
    ZS_ASSIGN_OR_RETURN(const CommittedCheckpointSource source,
                        manager_->FindCommittedCheckpoint(job_id, step));
    const v1::VerifyCheckpointResponse verified = VerifyCommittedCheckpoint(source);
    ZS_RETURN_IF_ERROR(SerializeResponse(verified, response_));
    if (response_->Length() > static_cast<size_t>(max_send_message_bytes_)) {
      response_->Clear();
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_send_message_bytes: the reply is ", verified.ByteSizeLong(), " bytes (",
          verified.files_size(), " files, ", verified.damaged_files(), " damaged), more than the ",
          max_send_message_bytes_, " this coordinator sends"));
    }
    return absl::OkStatus();
  }

  void FinishWith(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    metrics_->RecordRpc(std::string(MethodName(Method::kVerifyCheckpoint)), status.code(),
                        absl::Now() - start_);
    Finish(common::ToGrpcStatus(status));
  }

  JobManager* const manager_;
  CoordinatorMetrics* const metrics_;
  const int max_send_message_bytes_;
  // The call's raw response; written by the thread before it finishes the call.
  grpc::ByteBuffer* const response_;
  const std::function<void()> reading_ended_;
  const absl::Time start_;
  absl::Mutex mu_;
  // Assigned by Start() under mu_, joined by OnDone().
  std::thread thread_;
};

}  // namespace

CoordinatorService::CoordinatorService(JobManager* manager, RendezvousStore* rendezvous,
                                       CoordinatorMetrics* metrics,
                                       const security::Authenticator* authenticator,
                                       ServiceOptions options)
    : manager_(manager),
      rendezvous_(rendezvous),
      metrics_(metrics),
      authenticator_(authenticator),
      options_(options) {}

absl::StatusOr<security::Identity> CoordinatorService::Admit(const grpc::ServerContextBase& context,
                                                             Method method,
                                                             std::string* credential) const {
  ZS_ASSIGN_OR_RETURN(security::Identity caller, authenticator_->Authenticate(context, credential));
  ZS_RETURN_IF_ERROR(Authorize(caller, method));
  return caller;
}

absl::Status CoordinatorService::CheckWorkerCaller(const grpc::ServerContextBase& context,
                                                   const security::Identity& caller,
                                                   const std::string& worker_id) {
  // Admins act for any worker; only the worker role is bound to its registration.
  if (caller.role != security::Role::kWorker) return absl::OkStatus();
  return manager_->CheckWorkerSecret(worker_id, WorkerSecretOf(context));
}

absl::Status CoordinatorService::CheckStoreCaller(const grpc::ServerContextBase& context,
                                                  const security::Identity& caller,
                                                  const std::string& job_id, int64_t generation) {
  if (caller.role != security::Role::kWorker) return absl::OkStatus();
  return manager_->CheckStoreSecret(WorkerSecretOf(context), job_id, generation);
}

template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* CoordinatorService::Unary(grpc::CallbackServerContext* context,
                                                    Method method, const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response, Handler handler) {
  const absl::Time start = absl::Now();
  Request parsed_request;
  Response typed_response;
  absl::StatusOr<security::Identity> caller = Admit(*context, method);
  absl::Status status = caller.status();
  if (status.ok()) status = ParseRequest(*request, &parsed_request);
  if (status.ok()) status = handler(*caller, &parsed_request, &typed_response);
  if (status.ok()) status = SerializeResponse(typed_response, response);
  // gRPC's own refusal would not say which limit, or what to do.
  if (status.ok() && response->Length() > static_cast<size_t>(options_.max_send_message_bytes)) {
    response->Clear();
    status = absl::ResourceExhaustedError(
        absl::StrCat("max_send_message_bytes: the reply is ", typed_response.ByteSizeLong(),
                     " bytes, more than the ", options_.max_send_message_bytes,
                     " this coordinator sends; ask for less (filter or page)"));
  }
  return FinishUnary(context, method, start, status);
}

grpc::ServerUnaryReactor* CoordinatorService::FinishUnary(grpc::CallbackServerContext* context,
                                                          Method method, absl::Time start,
                                                          const absl::Status& status) {
  metrics_->RecordRpc(std::string(MethodName(method)), status.code(), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* raw_request,
                                                             grpc::ByteBuffer* raw_response) {
  return Unary<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
      context, Method::kRegisterWorker, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::RegisterWorkerRequest* request,
          v1::RegisterWorkerResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(ValidateRegisterWorkerRequest(*request));
        // Admins act for any worker; the worker role proves which one it was with its secret.
        RegistrationProof proof;
        proof.acts_for_any_worker = caller.role != security::Role::kWorker;
        proof.presented_secret = WorkerSecretOf(*context);
        ZS_ASSIGN_OR_RETURN(*response, manager_->RegisterWorker(*request, proof));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw_request,
                                                        grpc::ByteBuffer* raw_response) {
  return Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      context, Method::kHeartbeat, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::HeartbeatRequest* request,
          v1::HeartbeatResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(CheckWorkerCaller(*context, caller, request->worker_id()));
        ZS_RETURN_IF_ERROR(ValidateHeartbeatRequest(*request));
        ZS_ASSIGN_OR_RETURN(*response, manager_->Heartbeat(*request));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::LeaveWorker(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw_request,
                                                          grpc::ByteBuffer* raw_response) {
  return Unary<v1::LeaveWorkerRequest, v1::LeaveWorkerResponse>(
      context, Method::kLeaveWorker, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::LeaveWorkerRequest* request,
          v1::LeaveWorkerResponse*) -> absl::Status {
        ZS_RETURN_IF_ERROR(CheckWorkerCaller(*context, caller, request->worker_id()));
        ZS_RETURN_IF_ERROR(ValidateLeaveWorkerRequest(*request));
        return manager_->LeaveWorker(request->worker_id());
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw_request,
                                                          grpc::ByteBuffer* raw_response) {
  return Unary<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      context, Method::kListWorkers, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::ListWorkersRequest* request,
          v1::ListWorkersResponse* response) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(*response, coordinator::ListWorkers(*manager_, *request));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw_request,
                                                        grpc::ByteBuffer* raw_response) {
  return Unary<v1::SubmitJobRequest, v1::Job>(
      context, Method::kSubmitJob, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::SubmitJobRequest* request,
          v1::Job* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(ValidateSubmitJobRequest(*request));
        // Without authentication the caller is named by its peer host.
        // Another job's id is named only to an admin (or its own submitter).
        ZS_ASSIGN_OR_RETURN(*response, manager_->SubmitJob(request->spec(), caller.name,
                                                           caller.role == security::Role::kAdmin));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* raw_request,
                                                     grpc::ByteBuffer* raw_response) {
  return Unary<v1::GetJobRequest, v1::Job>(
      context, Method::kGetJob, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::GetJobRequest* request,
          v1::Job* response) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(*response, coordinator::GetJob(*manager_, *request, caller.name));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw_request,
                                                       grpc::ByteBuffer* raw_response) {
  return Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
      context, Method::kListJobs, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::ListJobsRequest* request,
          v1::ListJobsResponse* response) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(*response, coordinator::ListJobs(*manager_, *request));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw_request,
                                                        grpc::ByteBuffer* raw_response) {
  return Unary<v1::CancelJobRequest, v1::Job>(
      context, Method::kCancelJob, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::CancelJobRequest* request,
          v1::Job* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(ValidateCancelJobRequest(*request));
        // A submitter cancels only its own jobs; admins any.
        const std::optional<std::string> only_submitter =
            caller.role == security::Role::kSubmitter ? std::optional<std::string>(caller.name)
                                                      : std::nullopt;
        ZS_ASSIGN_OR_RETURN(
            *response, manager_->CancelJob(request->job_id(), request->reason(), only_submitter));
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  const absl::Time start = absl::Now();
  v1::WatchJobRequest request;
  std::string credential;
  absl::StatusOr<security::Identity> caller = Admit(*context, Method::kWatchJob, &credential);
  absl::Status status = caller.status();
  if (status.ok()) status = ParseRequest(*raw_request, &request);
  if (status.ok()) status = ValidateWatchJobRequest(request);
  auto* reactor = new WatchReactor(manager_, request.job_id(), options_.max_watch_backlog,
                                   options_.watch_page_events);
  if (status.ok()) {
    // Unknown jobs fail here; later errors (the store unreadable) end the stream instead.
    status = manager_->GetJob(request.job_id()).status();
  }
  const std::string peer_host = security::PeerHost(context->peer());
  // The reactor may be deleted once the stream finishes, which can happen within Start.
  const std::shared_ptr<WatchSink> sink = reactor->sink();
  uint64_t serial = 0;
  if (status.ok()) {
    OpenWatch watch{*caller, credential, [weak = std::weak_ptr<WatchSink>(sink)] {
                      if (const std::shared_ptr<WatchSink> open = weak.lock()) open->Revoke();
                    }};
    status = AdmitWatch(peer_host, std::move(watch), &serial);
  }
  metrics_->RecordRpc("WatchJob", status.code(), absl::Now() - start);
  if (!status.ok()) {
    reactor->Finish(common::ToGrpcStatus(status));
    return reactor;
  }
  reactor->set_released([this, peer_host, serial] { ReleaseWatch(peer_host, serial); });
  // A reload between Admit and AdmitWatch found no stream to end: the table it swapped in is
  // the one in use now, so asking again here leaves no gap.
  if (authenticator_->Revoked(credential, *caller)) sink->Revoke();
  sink->Start(request.after_sequence());
  return reactor;
}

absl::Status CoordinatorService::AdmitWatch(const std::string& peer_host, OpenWatch watch,
                                            uint64_t* serial) {
  absl::MutexLock lock(&watches_mu_);
  if (watch_streams_ >= options_.max_watch_streams) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_watch_streams: ", watch_streams_,
                     " WatchJob streams are open, the most this coordinator serves at once; "
                     "retry when one has ended"));
  }
  auto from_peer = watch_streams_by_peer_.find(peer_host);
  const int64_t open_from_peer = from_peer == watch_streams_by_peer_.end() ? 0 : from_peer->second;
  if (open_from_peer >= options_.max_watch_streams_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_watch_streams_per_peer: ", open_from_peer, " WatchJob streams are open from ",
        peer_host, ", the most one peer may hold; close one first"));
  }
  ++watch_streams_by_peer_[peer_host];
  ++watch_streams_;
  *serial = next_watch_serial_++;
  open_watches_[*serial] = std::move(watch);
  return absl::OkStatus();
}

std::vector<std::function<void()>> CoordinatorService::RevokedOf(
    const absl::flat_hash_map<uint64_t, OpenWatch>& streams) const {
  std::vector<std::function<void()>> revoked;
  for (const auto& [serial, stream] : streams) {
    if (authenticator_->Revoked(stream.credential, stream.caller)) revoked.push_back(stream.revoke);
  }
  return revoked;
}

namespace {

// Ends what RevokedOf found, outside the registry's lock: ending a stream takes the stream's
// own lock (never the other way round). Returns how many.
int64_t EndStreams(const std::vector<std::function<void()>>& revoked) {
  for (const std::function<void()>& revoke : revoked) revoke();
  return static_cast<int64_t>(revoked.size());
}

}  // namespace

int64_t CoordinatorService::EndRevokedWatches() {
  std::vector<std::function<void()>> revoked;
  {
    absl::MutexLock lock(&watches_mu_);
    revoked = RevokedOf(open_watches_);
  }
  return EndStreams(revoked);
}

int64_t CoordinatorService::OpenWatchStreams() {
  absl::MutexLock lock(&watches_mu_);
  return watch_streams_;
}

bool CoordinatorService::AwaitOpenWatchStreams(int64_t count, absl::Duration timeout) {
  absl::MutexLock lock(&watches_mu_);
  auto reached = [this, count]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(watches_mu_) { return watch_streams_ == count; };
  return watches_mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

void CoordinatorService::ReleaseWatch(const std::string& peer_host, uint64_t serial) {
  absl::MutexLock lock(&watches_mu_);
  --watch_streams_;
  open_watches_.erase(serial);
  auto it = watch_streams_by_peer_.find(peer_host);
  if (it != watch_streams_by_peer_.end() && --it->second <= 0) watch_streams_by_peer_.erase(it);
}

grpc::ServerUnaryReactor* CoordinatorService::GetShardPlan(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* raw_request,
                                                           grpc::ByteBuffer* raw_response) {
  return Unary<v1::GetShardPlanRequest, v1::ShardPlan>(
      context, Method::kGetShardPlan, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::GetShardPlanRequest* request,
          v1::ShardPlan* response) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(*response, coordinator::GetShardPlan(*manager_, *request));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw_request,
                                                       grpc::ByteBuffer* raw_response) {
  return Unary<v1::StoreSetRequest, v1::StoreSetResponse>(
      context, Method::kStoreSet, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::StoreSetRequest* request,
          v1::StoreSetResponse*) -> absl::Status {
        ZS_RETURN_IF_ERROR(
            CheckStoreCaller(*context, caller, request->job_id(), request->generation()));
        ZS_RETURN_IF_ERROR(ValidateStoreSetRequest(*request));
        return rendezvous_->Set(request->job_id(), request->generation(), request->key(),
                                request->value());
      });
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw_request,
                                                       grpc::ByteBuffer* raw_response) {
  const absl::Time start = absl::Now();
  v1::StoreGetRequest request;
  absl::StatusOr<security::Identity> caller = Admit(*context, Method::kStoreGet);
  absl::Status valid = caller.status();
  if (valid.ok()) valid = ParseRequest(*raw_request, &request);
  if (valid.ok())
    valid = CheckStoreCaller(*context, *caller, request.job_id(), request.generation());
  if (valid.ok()) valid = ValidateStoreGetRequest(request);
  if (!valid.ok()) return FinishUnary(context, Method::kStoreGet, start, valid);
  auto* reactor = new StoreGetReactor(rendezvous_, metrics_, start);
  reactor->Park(request, raw_response);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreAdd(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw_request,
                                                       grpc::ByteBuffer* raw_response) {
  return Unary<v1::StoreAddRequest, v1::StoreAddResponse>(
      context, Method::kStoreAdd, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::StoreAddRequest* request,
          v1::StoreAddResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(
            CheckStoreCaller(*context, caller, request->job_id(), request->generation()));
        ZS_RETURN_IF_ERROR(ValidateStoreAddRequest(*request));
        ZS_ASSIGN_OR_RETURN(const int64_t value,
                            rendezvous_->Add(request->job_id(), request->generation(),
                                             request->key(), request->delta()));
        response->set_value(value);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::StoreDelete(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw_request,
                                                          grpc::ByteBuffer* raw_response) {
  return Unary<v1::StoreDeleteRequest, v1::StoreDeleteResponse>(
      context, Method::kStoreDelete, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::StoreDeleteRequest* request,
          v1::StoreDeleteResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(
            CheckStoreCaller(*context, caller, request->job_id(), request->generation()));
        ZS_RETURN_IF_ERROR(ValidateStoreDeleteRequest(*request));
        ZS_ASSIGN_OR_RETURN(
            const bool deleted,
            rendezvous_->Delete(request->job_id(), request->generation(), request->key()));
        response->set_deleted(deleted);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportProgress(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* raw_request,
                                                             grpc::ByteBuffer* raw_response) {
  return Unary<v1::ReportProgressRequest, v1::ReportProgressResponse>(
      context, Method::kReportProgress, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::ReportProgressRequest* request,
          v1::ReportProgressResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(CheckWorkerCaller(*context, caller, request->worker_id()));
        ZS_RETURN_IF_ERROR(ValidateReportProgressRequest(*request));
        ZS_ASSIGN_OR_RETURN(*response, manager_->ReportProgress(*request));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::CommitCheckpoint(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* raw_request,
                                                               grpc::ByteBuffer* raw_response) {
  return Unary<v1::CommitCheckpointRequest, v1::CommitCheckpointResponse>(
      context, Method::kCommitCheckpoint, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::CommitCheckpointRequest* request,
          v1::CommitCheckpointResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(CheckWorkerCaller(*context, caller, request->worker_id()));
        ZS_RETURN_IF_ERROR(ValidateCommitCheckpointRequest(*request));
        ZS_ASSIGN_OR_RETURN(*response, manager_->CommitCheckpoint(*request));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::RewindJob(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw_request,
                                                        grpc::ByteBuffer* raw_response) {
  return Unary<v1::RewindJobRequest, v1::RewindJobResponse>(
      context, Method::kRewindJob, raw_request, raw_response,
      [&](const security::Identity& caller, const v1::RewindJobRequest* request,
          v1::RewindJobResponse* response) -> absl::Status {
        ZS_RETURN_IF_ERROR(CheckWorkerCaller(*context, caller, request->worker_id()));
        ZS_RETURN_IF_ERROR(ValidateRewindJobRequest(*request));
        ZS_ASSIGN_OR_RETURN(*response, manager_->RewindJob(*request));
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorService::ExportCheckpoint(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  auto* reactor = new ExportReactor(
      manager_, metrics_, [this] { ReleaseCheckpointReader(); }, options_.export_waits_for_testing);
  v1::ExportCheckpointRequest request;
  std::string credential;
  absl::StatusOr<security::Identity> caller =
      Admit(*context, Method::kExportCheckpoint, &credential);
  absl::Status valid = caller.status();
  if (valid.ok()) valid = ParseRequest(*raw_request, &request);
  if (valid.ok()) valid = ValidateExportCheckpointRequest(request);
  if (valid.ok()) valid = AdmitCheckpointReader("export");
  if (!valid.ok()) {
    reactor->Refuse(valid);
    return reactor;
  }
  // Kept while the stream lives, so that a token reload can end it (EndRevokedExports).
  std::shared_ptr<ExportReactor::Handle> handle = reactor->handle();
  const uint64_t serial = TrackExport(OpenWatch{*caller, credential, [handle] {
                                                  absl::MutexLock lock(&handle->mu);
                                                  if (handle->reactor != nullptr)
                                                    handle->reactor->Revoke();
                                                }});
  reactor->set_done([this, serial] { UntrackExport(serial); });
  // A reload between Admit and TrackExport found no stream to end.
  if (authenticator_->Revoked(credential, *caller)) reactor->Revoke();
  reactor->Start(request.job_id(),
                 request.has_step() ? std::optional<int64_t>(request.step()) : std::nullopt);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::VerifyCheckpoint(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* raw_request,
                                                               grpc::ByteBuffer* raw_response) {
  auto* reactor = new VerifyReactor(
      manager_, metrics_, options_.max_send_message_bytes, raw_response,
      [this] { ReleaseCheckpointReader(); }, absl::Now());
  v1::VerifyCheckpointRequest request;
  absl::Status valid = Admit(*context, Method::kVerifyCheckpoint).status();
  if (valid.ok()) valid = ParseRequest(*raw_request, &request);
  if (valid.ok()) valid = ValidateVerifyCheckpointRequest(request);
  if (valid.ok()) valid = AdmitCheckpointReader("verify");
  if (!valid.ok()) {
    reactor->Refuse(valid);
    return reactor;
  }
  reactor->Start(request.job_id(),
                 request.has_step() ? std::optional<int64_t>(request.step()) : std::nullopt);
  return reactor;
}

uint64_t CoordinatorService::TrackExport(OpenWatch stream) {
  absl::MutexLock lock(&exports_mu_);
  const uint64_t serial = next_export_serial_++;
  open_exports_[serial] = std::move(stream);
  return serial;
}

void CoordinatorService::UntrackExport(uint64_t serial) {
  absl::MutexLock lock(&exports_mu_);
  open_exports_.erase(serial);
}

int64_t CoordinatorService::EndRevokedExports() {
  std::vector<std::function<void()>> revoked;
  {
    absl::MutexLock lock(&exports_mu_);
    revoked = RevokedOf(open_exports_);
  }
  return EndStreams(revoked);
}

absl::Status CoordinatorService::AdmitCheckpointReader(absl::string_view method) {
  absl::MutexLock lock(&exports_mu_);
  if (exports_reading_ >= options_.max_concurrent_exports) {
    return absl::ResourceExhaustedError(
        absl::StrCat(method, ": ", exports_reading_,
                     " exports and checkpoint verifications are running, the most this "
                     "coordinator runs at once; retry when one has ended"));
  }
  ++exports_reading_;
  return absl::OkStatus();
}

void CoordinatorService::ReleaseCheckpointReader() {
  absl::MutexLock lock(&exports_mu_);
  --exports_reading_;
}

}  // namespace zeroshard::coordinator
