// The worker daemon's control loop: registers with the coordinator (retrying until it is up),
// heartbeats, and converges to the assignment each heartbeat reply carries (level-triggered):
// starts the assigned generation's TrainingRun, aborts runs that are no longer wanted, and
// re-registers when the coordinator forgot it. Between the regular heartbeats it sends one at once
// when it has news that moves a recovery along: its run ended (failed or finished), or a reply
// just stopped its run (it is free for the next generation). The coordinator is not in the data
// path: a run goes on while heartbeats fail, and a restarted coordinator adopts it when the daemon
// re-registers presenting its previous id and the run.
#ifndef ZEROSHARD_WORKER_DAEMON_WORKER_DAEMON_H_
#define ZEROSHARD_WORKER_DAEMON_WORKER_DAEMON_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "security/coordinator_channel.h"
#include "worker/daemon/training_run.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::worker {

struct WorkerDaemonOptions {
  std::string name;
  std::string host;
  v1::DeviceKind device_kind = v1::CPU;
  int64_t device_memory_bytes = 0;
  // The worker's --memory_limit_bytes (0: none), told to the coordinator at registration so that
  // it refuses and does not place jobs that need more per rank.
  int64_t memory_limit_bytes = 0;
  std::map<std::string, std::string> labels;
  // Used until the coordinator's RegisterWorker reply says otherwise (it always does).
  absl::Duration heartbeat_period = absl::Seconds(1);
  // Wait between registration attempts while the coordinator is unreachable.
  absl::Duration register_retry = absl::Milliseconds(500);
  absl::Duration rpc_timeout = absl::Seconds(5);
  // The unix socket attached trainers connect to (registered with the coordinator); empty: none.
  std::string attach_socket;
  // Set from every registration's reply; the daemon's coordinator channels send it on each call
  // (security::CreateCoordinatorChannel). Null: not kept (a coordinator without a token file).
  std::shared_ptr<security::WorkerSecret> worker_secret;
  // Where the daemon keeps its latest registration's id and secret (identity_file.h), so that
  // after a restart it presents them and gets its name back at once: a name is held by proof, and
  // without them a restarted daemon waits until its old registration has been gone for the
  // coordinator's --dead_worker_retention. Empty: not kept. Needs worker_secret.
  std::string identity_file;
  // Liveness() fails once the coordinator has refused this daemon a registration this long
  // without a break (--unregistered_unhealthy_after): a pod restart is the last resort.
  absl::Duration unregistered_unhealthy_after = absl::Minutes(5);
};

// Thread contract: Run() on one thread; Stop() from any thread (e.g. a signal watcher).
class WorkerDaemon {
 public:
  WorkerDaemon(WorkerDaemonOptions options, std::shared_ptr<v1::Coordinator::StubInterface> stub,
               TrainingRunFactory run_factory);

  // Runs until Stop(): then aborts the current run, leaves the coordinator and returns OK.
  // Heartbeats answered NOT_FOUND (the coordinator forgot this worker: it restarted, or the
  // worker's registration was forgotten) make it register again, presenting its id, secret and
  // run; heartbeats refused with PERMISSION_DENIED for a whole lease (its registration was
  // replaced) make it register as a new worker and abort its run. A registration refused with
  // ALREADY_EXISTS (its name is still held: by its own previous process, or for a holder whose
  // proof this daemon lacks, until the coordinator's retention passed) is retried, and logged
  // with the coordinator's reason. With identity_file, it first presents the identity kept there
  // (an unusable file ends Run() with its error) and keeps each new registration's there.
  // Returns the error early when registering fails for good (INVALID_ARGUMENT, UNAUTHENTICATED,
  // PERMISSION_DENIED: bad flags or credentials), also when
  // re-registering after the coordinator forgot this worker. Failed heartbeats (the coordinator
  // is down) never stop the run; only the coordinator's answers do.
  absl::Status Run();
  void Stop();

  // The id of the current registration (empty before the first). Any thread.
  std::string worker_id() const;

  // OK while registered and the latest heartbeat (or registration) reached the coordinator;
  // otherwise UNAVAILABLE with a one-line reason. For a readiness probe: a run goes on while the
  // coordinator is away, so this says "not schedulable now", never "restart me". Any thread.
  absl::Status Readiness() const;
  // OK unless the coordinator has refused this daemon a registration (heartbeats refused,
  // registrations refused) for longer than unregistered_unhealthy_after without a break; then
  // UNAVAILABLE with the reason. An unreachable coordinator is no refusal: a run goes on without
  // it. For a liveness probe. Any thread.
  absl::Status Liveness() const;

 private:
  // Registers, presenting the previous id and the current run (if any) so that a restarted
  // coordinator can adopt the run. Returns whether it did.
  absl::StatusOr<bool> Register();
  // What the worker runs, for heartbeats and registrations.
  v1::WorkerStatus RunStatus() const;
  // Sets up `context` for a registration or heartbeat: it waits for the coordinator to be
  // reachable, up to rpc_timeout (wait_for_ready), so that the call itself drives gRPC's
  // reconnection after a coordinator restart; calls that fail at once leave that to gRPC's
  // backup poller, which runs every 5 s. Stop() cancels the call. EndCall() after it.
  void BeginCall(grpc::ClientContext& context);
  void EndCall();
  // One heartbeat and the convergence step after it.
  absl::Status HeartbeatOnce();
  // Waits until `next` or Stop(), or until there is news for the coordinator after a heartbeat
  // that reached it (HasNews; checked every kNewsPollInterval).
  void WaitForNextHeartbeat(absl::Time next);
  // Whether what a heartbeat would report now differs from what the last one reported: the
  // run has ended since, or there is no run any more.
  bool HasNews() const;
  void Converge(const v1::Assignment& assignment);
  // Aborts the current run (if any) and moves it to retiring_.
  void AbortRun();
  // Drops the retiring runs whose threads have ended.
  void ReapRetiredRuns();
  bool IsCurrentRun(const v1::Assignment& assignment) const;
  // Keeps "stopping" once Stop() was called.
  void SetReadiness(absl::Status readiness);
  // Notes that the coordinator refused this daemon (`why`), or (OK) accepted it.
  void NoteRefusal(const absl::Status& why);
  // Drops the current registration's id and secret: the next registration is a new worker's.
  void ForgetRegistration();
  // options_.identity_file: presents the identity kept there (if any) at the next registration.
  absl::Status LoadIdentity();
  // Logs an ALREADY_EXISTS refusal: the first, then at most every kRefusalLogInterval (it is
  // retried every register_retry), and whenever its reason changes.
  void LogNameRefusal(const absl::Status& refusal);

  const WorkerDaemonOptions options_;
  std::shared_ptr<v1::Coordinator::StubInterface> stub_;
  TrainingRunFactory run_factory_;
  // Set by the first Stop(), which alone notifies stop_.
  std::atomic<bool> stop_requested_{false};
  absl::Notification stop_;

  absl::Mutex call_mu_;
  // The registration or heartbeat under way (Run()'s thread), for Stop() to cancel.
  grpc::ClientContext* call_ ABSL_GUARDED_BY(call_mu_) = nullptr;

  mutable absl::Mutex id_mu_;
  // Written by Run()'s thread, read by any.
  std::string worker_id_ ABSL_GUARDED_BY(id_mu_);
  mutable absl::Mutex readiness_mu_;
  // Written by Run()'s thread after each registration attempt and heartbeat, read by any.
  absl::Status readiness_ ABSL_GUARDED_BY(readiness_mu_) =
      absl::UnavailableError("not registered with the coordinator yet");
  // Since when the coordinator has refused this daemon without a break, and its last refusal.
  std::optional<absl::Time> refused_since_ ABSL_GUARDED_BY(readiness_mu_);
  absl::Status last_refusal_ ABSL_GUARDED_BY(readiness_mu_);

  // Only Run()'s thread touches these.
  absl::Duration heartbeat_period_;
  // The lease the coordinator gave (RegisterWorker's reply).
  absl::Duration lease_;
  // Since when heartbeats have been refused with PERMISSION_DENIED, without a break.
  std::optional<absl::Time> heartbeats_denied_since_;
  // The last ALREADY_EXISTS refusal logged (its reason up to the time it gives), and when.
  std::string logged_refusal_;
  absl::Time refusal_logged_at_ = absl::InfinitePast();
  std::unique_ptr<TrainingRun> run_;
  v1::Assignment run_assignment_;
  // Whether run_'s failure has been logged.
  bool run_failure_logged_ = false;
  // What the last heartbeat that reached the coordinator reported (HasNews).
  bool last_heartbeat_ok_ = false;
  bool reported_run_ended_ = false;
  bool reported_no_run_ = false;
  // Aborted runs whose threads have not ended yet (a run blocked in a rendezvous can take long
  // to notice). Kept here rather than joined inline so heartbeats, and the lease, go on.
  std::vector<std::unique_ptr<TrainingRun>> retiring_;
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_WORKER_DAEMON_H_
