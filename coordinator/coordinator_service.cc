// The Coordinator service's gRPC handlers: the unary glue, and the admission and bookkeeping of
// the streams and parked calls whose reactors live beside it (watch_stream, export_stream,
// store_get_reactor).
#include "coordinator/coordinator_service.h"

#include <algorithm>
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
#include "coordinator/export_stream.h"
#include "coordinator/ids.h"
#include "coordinator/queries.h"
#include "coordinator/request_parsing.h"
#include "coordinator/request_validation.h"
#include "coordinator/store_get_reactor.h"
#include "coordinator/watch_stream.h"
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
