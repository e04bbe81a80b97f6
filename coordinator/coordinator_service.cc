// The Coordinator service's gRPC handlers.
#include "coordinator/coordinator_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/request_validation.h"

namespace zeroshard::coordinator {
namespace {

// A StoreGet call parked in the rendezvous store. Finishes exactly once (the store calls back
// exactly once); a client that goes away cancels its wait.
class StoreGetReactor final : public grpc::ServerUnaryReactor {
 public:
  StoreGetReactor(RendezvousStore* store, CoordinatorMetrics* metrics)
      : store_(store), metrics_(metrics), start_(absl::Now()) {}

  void Park(const v1::StoreGetRequest& request, v1::StoreGetResponse* response) {
    const RendezvousStore::WaiterId id =
        store_->Get(request.job_id(), request.generation(), request.key(),
                    absl::Milliseconds(request.timeout_ms()),
                    [this, response](absl::StatusOr<std::string> value) {
                      if (value.ok()) response->set_value(*std::move(value));
                      metrics_->RecordRpc("StoreGet", value.status().code(), absl::Now() - start_);
                      Finish(common::ToGrpcStatus(value.status()));
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

// The manager's handle on one WatchJob stream. Never blocks: events queue here and the reactor
// writes them one at a time; a full queue ends the stream (the watcher fell behind).
// StartWrite and Finish are called with mu_ held: gRPC never runs a reaction inline with the
// call that starts the operation, so this cannot re-enter.
class WatchSink final : public JobEventSink {
 public:
  WatchSink(WatchReactor* reactor, size_t max_backlog)
      : reactor_(reactor), max_backlog_(max_backlog) {}

  bool OnEvent(const v1::JobEvent& event) override;
  void OnJobEnded() override;
  // The reactor finished writing the front event.
  void OnWriteDone(bool ok);
  // The client went away.
  void OnCancel();
  // The reactor is about to be deleted.
  void Detach();

 private:
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Null once the reactor is done.
  WatchReactor* reactor_ ABSL_GUARDED_BY(mu_);
  const size_t max_backlog_;
  // Events not yet written; the front one is being written while `writing_`.
  std::deque<v1::JobEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool job_ended_ ABSL_GUARDED_BY(mu_) = false;
  // Finish was called: nothing more is written.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_written_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  explicit WatchReactor(size_t max_backlog)
      : sink_(std::make_shared<WatchSink>(this, max_backlog)) {}

  std::shared_ptr<WatchSink> sink() { return sink_; }
  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }
  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  std::shared_ptr<WatchSink> sink_;
};

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
  queue_.push_back(event);
  if (!writing_) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front());
  }
  return true;
}

void WatchSink::OnJobEnded() {
  absl::MutexLock lock(&mu_);
  job_ended_ = true;
  if (!writing_ && !finished_) FinishLocked(grpc::Status::OK);
}

void WatchSink::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  if (!ok) {
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch: write failed"));
    return;
  }
  last_written_sequence_ = queue_.front().sequence();
  queue_.pop_front();
  if (!queue_.empty()) {
    reactor_->StartWrite(&queue_.front());
    return;
  }
  writing_ = false;
  if (job_ended_) FinishLocked(grpc::Status::OK);
}

void WatchSink::OnCancel() {
  absl::MutexLock lock(&mu_);
  if (!finished_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch: cancelled"));
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

}  // namespace

CoordinatorService::CoordinatorService(JobManager* manager, RendezvousStore* rendezvous,
                                       CoordinatorMetrics* metrics, ServiceOptions options)
    : manager_(manager), rendezvous_(rendezvous), metrics_(metrics), options_(options) {}

template <typename Handler>
grpc::ServerUnaryReactor* CoordinatorService::Unary(grpc::CallbackServerContext* context,
                                                    const char* method, Handler handler) {
  const absl::Time start = absl::Now();
  const absl::Status status = handler();
  metrics_->RecordRpc(method, status.code(), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  return Unary(context, "RegisterWorker", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateRegisterWorkerRequest(*request));
    *response = manager_->RegisterWorker(*request);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  return Unary(context, "Heartbeat", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateHeartbeatRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->Heartbeat(*request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::LeaveWorker(grpc::CallbackServerContext* context,
                                                          const v1::LeaveWorkerRequest* request,
                                                          v1::LeaveWorkerResponse*) {
  return Unary(context, "LeaveWorker", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateLeaveWorkerRequest(*request));
    return manager_->LeaveWorker(request->worker_id());
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const v1::ListWorkersRequest* request,
                                                          v1::ListWorkersResponse* response) {
  return Unary(context, "ListWorkers", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateListWorkersRequest(*request));
    for (v1::WorkerInfo& worker : manager_->ListWorkers(request->state())) {
      *response->add_workers() = std::move(worker);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const v1::SubmitJobRequest* request,
                                                        v1::Job* response) {
  return Unary(context, "SubmitJob", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateSubmitJobRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->SubmitJob(request->spec()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request,
                                                     v1::Job* response) {
  return Unary(context, "GetJob", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateGetJobRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->GetJob(request->job_id()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const v1::ListJobsRequest* request,
                                                       v1::ListJobsResponse* response) {
  return Unary(context, "ListJobs", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateListJobsRequest(*request));
    const int64_t limit = request->has_limit() ? request->limit() : 100;
    for (v1::Job& job : manager_->ListJobs(request->state(), limit)) {
      *response->add_jobs() = std::move(job);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const v1::CancelJobRequest* request,
                                                        v1::Job* response) {
  return Unary(context, "CancelJob", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateCancelJobRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->CancelJob(request->job_id(), request->reason()));
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext*, const v1::WatchJobRequest* request) {
  const absl::Time start = absl::Now();
  auto* reactor = new WatchReactor(options_.max_watch_backlog);
  absl::Status status = ValidateWatchJobRequest(*request);
  if (status.ok()) {
    status = manager_->Watch(request->job_id(), request->after_sequence(), reactor->sink());
  }
  metrics_->RecordRpc("WatchJob", status.code(), absl::Now() - start);
  if (!status.ok()) reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetShardPlan(grpc::CallbackServerContext* context,
                                                           const v1::GetShardPlanRequest* request,
                                                           v1::ShardPlan* response) {
  return Unary(context, "GetShardPlan", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateGetShardPlanRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->GetShardPlan(*request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(grpc::CallbackServerContext* context,
                                                       const v1::StoreSetRequest* request,
                                                       v1::StoreSetResponse*) {
  return Unary(context, "StoreSet", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateStoreSetRequest(*request));
    return rendezvous_->Set(request->job_id(), request->generation(), request->key(),
                            request->value());
  });
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(grpc::CallbackServerContext* context,
                                                       const v1::StoreGetRequest* request,
                                                       v1::StoreGetResponse* response) {
  if (absl::Status valid = ValidateStoreGetRequest(*request); !valid.ok()) {
    return Unary(context, "StoreGet", [&] { return valid; });
  }
  auto* reactor = new StoreGetReactor(rendezvous_, metrics_);
  reactor->Park(*request, response);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreAdd(grpc::CallbackServerContext* context,
                                                       const v1::StoreAddRequest* request,
                                                       v1::StoreAddResponse* response) {
  return Unary(context, "StoreAdd", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateStoreAddRequest(*request));
    ZS_ASSIGN_OR_RETURN(const int64_t value,
                        rendezvous_->Add(request->job_id(), request->generation(), request->key(),
                                         request->delta()));
    response->set_value(value);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::StoreDelete(grpc::CallbackServerContext* context,
                                                          const v1::StoreDeleteRequest* request,
                                                          v1::StoreDeleteResponse* response) {
  return Unary(context, "StoreDelete", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateStoreDeleteRequest(*request));
    ZS_ASSIGN_OR_RETURN(
        const bool deleted,
        rendezvous_->Delete(request->job_id(), request->generation(), request->key()));
    response->set_deleted(deleted);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportProgress(
    grpc::CallbackServerContext* context, const v1::ReportProgressRequest* request,
    v1::ReportProgressResponse* response) {
  return Unary(context, "ReportProgress", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateReportProgressRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->ReportProgress(*request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::CommitCheckpoint(
    grpc::CallbackServerContext* context, const v1::CommitCheckpointRequest* request,
    v1::CommitCheckpointResponse* response) {
  return Unary(context, "CommitCheckpoint", [&]() -> absl::Status {
    ZS_RETURN_IF_ERROR(ValidateCommitCheckpointRequest(*request));
    ZS_ASSIGN_OR_RETURN(*response, manager_->CommitCheckpoint(*request));
    return absl::OkStatus();
  });
}

}  // namespace zeroshard::coordinator
