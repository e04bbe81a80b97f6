// The worker daemon's control loop.
#include "worker/daemon/worker_daemon.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/daemon/identity_file.h"

namespace zeroshard::worker {
namespace {

// WorkerStatus.run_error's bound (worker.proto).
constexpr size_t kMaxRunErrorBytes = 1024;
// An unchanged ALREADY_EXISTS refusal is logged again this often (registration retries it every
// register_retry).
constexpr absl::Duration kRefusalLogInterval = absl::Seconds(30);

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options,
                           std::shared_ptr<v1::Coordinator::StubInterface> stub,
                           TrainingRunFactory run_factory)
    : options_(std::move(options)),
      stub_(std::move(stub)),
      run_factory_(std::move(run_factory)),
      heartbeat_period_(options_.heartbeat_period),
      lease_(3 * options_.heartbeat_period) {}

std::string WorkerDaemon::worker_id() const {
  absl::MutexLock lock(&id_mu_);
  return worker_id_;
}

void WorkerDaemon::Stop() {
  // Notify() may run only once: two threads could both see HasBeenNotified() false.
  if (!stop_requested_.exchange(true)) stop_.Notify();
  SetReadiness(absl::UnavailableError("stopping"));
  absl::MutexLock lock(&call_mu_);
  if (call_ != nullptr) call_->TryCancel();
}

void WorkerDaemon::BeginCall(grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  context.set_wait_for_ready(true);
  absl::MutexLock lock(&call_mu_);
  call_ = &context;
  // A Stop() that came before call_ was set cancels here (a call cancelled before it starts
  // ends as soon as it starts).
  if (stop_requested_.load()) context.TryCancel();
}

void WorkerDaemon::EndCall() {
  absl::MutexLock lock(&call_mu_);
  call_ = nullptr;
}

absl::StatusOr<bool> WorkerDaemon::Register() {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_host(options_.host);
  request.set_device_kind(options_.device_kind);
  request.set_device_memory_bytes(options_.device_memory_bytes);
  request.set_memory_limit_bytes(options_.memory_limit_bytes);
  request.set_attach_socket(options_.attach_socket);
  for (const auto& [key, value] : options_.labels) (*request.mutable_labels())[key] = value;
  request.set_previous_worker_id(worker_id());
  while (!stop_.HasBeenNotified()) {
    // The run trains on meanwhile: each attempt presents its latest step.
    if (run_ != nullptr) *request.mutable_status() = RunStatus();
    grpc::ClientContext context;
    BeginCall(context);
    v1::RegisterWorkerResponse response;
    const absl::Status status =
        common::FromGrpcStatus(stub_->RegisterWorker(&context, request, &response));
    EndCall();
    if (status.ok()) {
      {
        absl::MutexLock lock(&id_mu_);
        worker_id_ = response.worker_id();
      }
      SetReadiness(absl::OkStatus());
      NoteRefusal(absl::OkStatus());
      // Before any later call: the secret is bound to this registration.
      if (options_.worker_secret != nullptr) options_.worker_secret->Set(response.worker_secret());
      logged_refusal_.clear();
      if (!options_.identity_file.empty() && options_.worker_secret != nullptr) {
        // Kept for a restart of this daemon: without it the restarted daemon cannot prove that
        // the name is its own.
        const absl::Status kept = WriteIdentityFile(
            options_.identity_file, {response.worker_id(), response.worker_secret()});
        if (!kept.ok()) {
          ZS_LOG(ERROR) << "registered as " << response.worker_id()
                        << ", but cannot keep that identity for a restart: " << kept;
        }
      }
      heartbeat_period_ = absl::Milliseconds(response.heartbeat_period_ms());
      lease_ = absl::Milliseconds(response.lease_ms());
      heartbeats_denied_since_.reset();
      ZS_LOG(INFO) << "registered as " << response.worker_id() << " (heartbeat every "
                   << heartbeat_period_ << ", lease " << response.lease_ms() << " ms)"
                   << (response.adopted()
                           ? absl::StrCat("; the coordinator adopted ", request.status().job_id(),
                                          " generation ", request.status().generation(), " rank ",
                                          request.status().rank())
                           : "");
      return response.adopted();
    }
    // Bad flags or credentials will not get better by retrying.
    if (status.code() == absl::StatusCode::kInvalidArgument ||
        status.code() == absl::StatusCode::kUnauthenticated ||
        status.code() == absl::StatusCode::kPermissionDenied) {
      return status;
    }
    SetReadiness(absl::UnavailableError(
        absl::StrCat("not registered with the coordinator: ", status.message())));
    if (status.code() == absl::StatusCode::kAlreadyExists) {
      // The name is held: by this worker's own earlier process until its lease ends, reserved
      // for a rank being adopted, or kept for a holder whose proof this daemon lacks until the
      // coordinator's retention passed. Each frees up by itself: retried, no operator needed.
      NoteRefusal(status);
      LogNameRefusal(status);
    } else {
      ZS_LOG(INFO) << "coordinator not reachable yet (" << status.message() << "); retrying";
    }
    stop_.WaitForNotificationWithTimeout(options_.register_retry);
  }
  return absl::CancelledError("stopped before registering");
}

absl::Status WorkerDaemon::LoadIdentity() {
  if (options_.identity_file.empty()) return absl::OkStatus();
  if (options_.worker_secret == nullptr) {
    return absl::FailedPreconditionError(
        "identity_file: this daemon keeps no worker secret, so it has no identity to keep");
  }
  ZS_ASSIGN_OR_RETURN(const std::optional<WorkerIdentity> kept,
                      ReadIdentityFile(options_.identity_file));
  if (!kept.has_value()) {
    ZS_LOG(INFO) << "no identity kept in " << options_.identity_file
                 << " yet: the first registration starts one";
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&id_mu_);
    worker_id_ = kept->worker_id;
  }
  options_.worker_secret->Set(kept->secret);
  ZS_LOG(INFO) << "presenting the identity kept in " << options_.identity_file << " ("
               << kept->worker_id << ") to get the name " << options_.name << " back";
  return absl::OkStatus();
}

void WorkerDaemon::LogNameRefusal(const absl::Status& refusal) {
  // The reason without the time it gives, which changes on every retry.
  const absl::string_view message = refusal.message();
  const std::string reason(message.substr(0, message.rfind(": in ")));
  const absl::Time now = absl::Now();
  if (reason == logged_refusal_ && now - refusal_logged_at_ < kRefusalLogInterval) return;
  logged_refusal_ = reason;
  refusal_logged_at_ = now;
  ZS_LOG(WARNING) << "registration refused: " << message << "; retrying every "
                  << options_.register_retry
                  << (options_.identity_file.empty() && absl::StrContains(message, "held by proof")
                          ? " (this daemon keeps no identity across restarts: --identity_file)"
                          : "");
}

absl::Status WorkerDaemon::Run() {
  if (absl::Status loaded = LoadIdentity(); !loaded.ok()) return loaded;
  if (absl::StatusOr<bool> registered = Register(); !registered.ok()) {
    return stop_.HasBeenNotified() ? absl::OkStatus() : registered.status();
  }
  // Stays OK unless re-registering fails for a reason other than Stop().
  absl::Status result;
  while (!stop_.HasBeenNotified()) {
    const absl::Time next = absl::Now() + heartbeat_period_;
    if (absl::Status beat = HeartbeatOnce(); !beat.ok()) {
      if (beat.code() == absl::StatusCode::kNotFound) {
        // The coordinator forgot us (a restart, or our lease ended). The run goes on while we
        // register again: a restarted coordinator adopts it rather than ending its generation.
        ZS_LOG(WARNING) << "coordinator does not know " << worker_id() << "; registering again";
        absl::StatusOr<bool> adopted = Register();
        if (!adopted.ok()) {
          if (!stop_.HasBeenNotified()) result = adopted.status();
          break;
        }
        // Not adopted: for the coordinator that generation is over.
        if (!*adopted) AbortRun();
        continue;
      }
      if (beat.code() == absl::StatusCode::kPermissionDenied) {
        // Our secret no longer fits our registration (replaced, or a coordinator that lost
        // it). Refused for a whole lease, the registration is over for the coordinator too: start
        // afresh as a new worker rather than beat in vain forever.
        const absl::Time now = absl::Now();
        if (!heartbeats_denied_since_.has_value()) heartbeats_denied_since_ = now;
        NoteRefusal(beat);
        if (now - *heartbeats_denied_since_ >= lease_) {
          ZS_LOG(ERROR) << "heartbeats of " << worker_id() << " refused for "
                        << (now - *heartbeats_denied_since_) << " (a lease is " << lease_
                        << "): " << beat.message()
                        << "; aborting its run and registering as a new worker";
          AbortRun();
          ForgetRegistration();
          absl::StatusOr<bool> registered = Register();
          if (!registered.ok()) {
            if (!stop_.HasBeenNotified()) result = registered.status();
            break;
          }
          continue;
        }
      }
      // The coordinator is down or slow: the run does not need it, so it goes on.
      ZS_LOG(WARNING) << "heartbeat failed: " << beat;
    }
    ReapRetiredRuns();
    WaitForNextHeartbeat(next);
  }
  AbortRun();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  v1::LeaveWorkerRequest leave;
  leave.set_worker_id(worker_id());
  v1::LeaveWorkerResponse left;
  const absl::Status status = common::FromGrpcStatus(stub_->LeaveWorker(&context, leave, &left));
  ZS_LOG(INFO) << "left the coordinator: " << status;
  retiring_.clear();  // joins the aborted runs' threads
  return result;
}

absl::Status WorkerDaemon::Liveness() const {
  absl::MutexLock lock(&readiness_mu_);
  if (!refused_since_.has_value()) return absl::OkStatus();
  const absl::Duration refused = absl::Now() - *refused_since_;
  if (refused <= options_.unregistered_unhealthy_after) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the coordinator has refused this worker a registration for ",
                   absl::FormatDuration(refused), " (--unregistered_unhealthy_after=",
                   absl::FormatDuration(options_.unregistered_unhealthy_after),
                   "); last: ", last_refusal_.message()));
}

void WorkerDaemon::NoteRefusal(const absl::Status& why) {
  absl::MutexLock lock(&readiness_mu_);
  if (why.ok()) {
    refused_since_.reset();
    return;
  }
  if (!refused_since_.has_value()) refused_since_ = absl::Now();
  last_refusal_ = why;
}

void WorkerDaemon::ForgetRegistration() {
  {
    absl::MutexLock lock(&id_mu_);
    worker_id_.clear();
  }
  if (options_.worker_secret != nullptr) options_.worker_secret->Set("");
}

absl::Status WorkerDaemon::Readiness() const {
  absl::MutexLock lock(&readiness_mu_);
  return readiness_;
}

void WorkerDaemon::SetReadiness(absl::Status readiness) {
  absl::MutexLock lock(&readiness_mu_);
  if (stop_requested_.load()) readiness = absl::UnavailableError("stopping");
  readiness_ = std::move(readiness);
}

v1::WorkerStatus WorkerDaemon::RunStatus() const {
  v1::WorkerStatus status;
  if (run_ == nullptr) return status;
  status.set_job_id(run_assignment_.job_id());
  status.set_generation(run_assignment_.generation());
  status.set_rank(run_assignment_.rank());
  status.set_step(run_->step());
  if (run_->Done()) {
    const absl::Status run_status = run_->status();
    // A failed run says so, so the coordinator ends the generation instead of waiting for it.
    // A finished one says so too: a restarted coordinator does not know which ranks finished.
    if (run_status.ok()) {
      status.set_finished(true);
    } else {
      status.set_run_error(std::string(run_status.ToString()).substr(0, kMaxRunErrorBytes));
      // The peers it saw die: the coordinator does not wait for them to come back.
      for (int32_t rank : run_->lost_peer_ranks()) status.add_lost_peer_ranks(rank);
    }
  }
  return status;
}

absl::Status WorkerDaemon::HeartbeatOnce() {
  v1::HeartbeatRequest request;
  request.set_worker_id(worker_id());
  *request.mutable_status() = RunStatus();
  grpc::ClientContext context;
  BeginCall(context);
  v1::HeartbeatResponse response;
  const absl::Status status =
      common::FromGrpcStatus(stub_->Heartbeat(&context, request, &response));
  EndCall();
  last_heartbeat_ok_ = status.ok();
  SetReadiness(status.ok() ? absl::OkStatus()
                           : absl::UnavailableError(
                                 absl::StrCat("last heartbeat failed: ", status.message())));
  if (!status.ok()) return status;
  heartbeats_denied_since_.reset();
  NoteRefusal(absl::OkStatus());
  reported_run_ended_ = request.status().finished() || !request.status().run_error().empty();
  reported_no_run_ = run_ == nullptr;
  Converge(response.assignment());
  return absl::OkStatus();
}

bool WorkerDaemon::HasNews() const {
  if (run_ == nullptr) return !reported_no_run_;
  return run_->Done() && !reported_run_ended_;
}

void WorkerDaemon::WaitForNextHeartbeat(absl::Time next) {
  // Short enough to add little to a recovery, long enough to cost nothing while training.
  constexpr absl::Duration kNewsPollInterval = absl::Milliseconds(20);
  while (absl::Now() < next) {
    // After a failed heartbeat (the coordinator is down) the regular period applies.
    if (last_heartbeat_ok_ && HasNews()) return;
    if (stop_.WaitForNotificationWithTimeout(std::min(next - absl::Now(), kNewsPollInterval))) {
      return;
    }
  }
}

bool WorkerDaemon::IsCurrentRun(const v1::Assignment& assignment) const {
  return run_ != nullptr && run_assignment_.job_id() == assignment.job_id() &&
         run_assignment_.generation() == assignment.generation() &&
         run_assignment_.rank() == assignment.rank();
}

void WorkerDaemon::Converge(const v1::Assignment& assignment) {
  if (assignment.kind() == v1::ASSIGNMENT_RUN) {
    if (IsCurrentRun(assignment)) {
      // Logged once: the assignment stays RUN on every heartbeat until the coordinator moves on.
      if (!run_failure_logged_ && run_->Done() && !run_->status().ok()) {
        run_failure_logged_ = true;
        ZS_LOG(ERROR) << "run of " << assignment.job_id() << " generation "
                      << assignment.generation() << " failed: " << run_->status();
      }
      return;
    }
    AbortRun();
    ZS_LOG(INFO) << "starting " << assignment.job_id() << " generation " << assignment.generation()
                 << " as rank " << assignment.rank() << " of " << assignment.world_size();
    run_assignment_ = assignment;
    run_failure_logged_ = false;
    run_ = run_factory_(assignment);
    return;
  }
  // IDLE or ABORT: nothing may run (a finished run is simply forgotten).
  AbortRun();
}

void WorkerDaemon::AbortRun() {
  if (run_ == nullptr) return;
  if (!run_->Done()) {
    ZS_LOG(INFO) << "aborting " << run_assignment_.job_id() << " generation "
                 << run_assignment_.generation();
    run_->Abort();
  }
  if (run_->Done()) {
    run_.reset();  // its thread has ended: joining is immediate
  } else {
    retiring_.push_back(std::move(run_));
  }
  run_assignment_.Clear();
}

void WorkerDaemon::ReapRetiredRuns() {
  retiring_.erase(
      std::remove_if(retiring_.begin(), retiring_.end(),
                     [](const std::unique_ptr<TrainingRun>& run) { return run->Done(); }),
      retiring_.end());
}

}  // namespace zeroshard::worker
