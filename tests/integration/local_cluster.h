// A real local cluster for integration tests: the zeroshard-coordinator and zeroshard-worker
// binaries (Bazel runfiles) as subprocesses on loopback, logs and state under $TEST_TMPDIR.
#ifndef ZEROSHARD_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
#define ZEROSHARD_TESTS_INTEGRATION_LOCAL_CLUSTER_H_

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::testing {

// TLS and identities (docs/operations.md, "TLS and tokens"). All empty: plaintext and no token
// file, where the coordinator takes every caller for an admin.
struct LocalClusterSecurity {
  // The coordinator's certificate and key (PEM): TLS on its gRPC port.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Client certificates signed by this CA are verified (mTLS); with require_client_cert the
  // coordinator refuses clients without one at the handshake.
  std::string tls_client_ca_file;
  bool require_client_cert = false;
  // The coordinator's --token_file (`token role name`, `cert:<CN> role name` lines).
  std::string token_file;
  // What clients trust: the CA that signed tls_cert_file. Every worker gets it as --ca.
  std::string ca_file;
  // The harness's own client (client(), the waits): a token able to list every worker (an
  // admin's), and optionally a client certificate.
  std::string client_token;
  std::string client_cert_file;
  std::string client_key_file;
  // Every worker's --token_file; empty: none (give a worker --cert/--key, or nothing, through
  // StartWorker's extra flags).
  std::string worker_token_file;
};

struct LocalClusterOptions {
  // The coordinator's --heartbeat_period and --missed_heartbeats (a worker is dead after
  // heartbeat_period * missed_heartbeats without a heartbeat).
  absl::Duration heartbeat_period = absl::Seconds(1);
  int missed_heartbeats = 3;
  // How long a start (coordinator serving, workers idle) or a stop may take.
  absl::Duration start_deadline = absl::Seconds(30);
  absl::Duration stop_deadline = absl::Seconds(10);
  // Each worker's --threads, and flags appended to every worker's command line.
  int worker_threads = 1;
  std::vector<std::string> extra_worker_flags;
  // Flags appended to the coordinator's command line (every start).
  std::vector<std::string> extra_coordinator_flags;
  // Under $TEST_TMPDIR when empty: a fresh directory per LocalCluster.
  std::string base_dir;
  LocalClusterSecurity security;
};

// One child process in its own process group, stdout and stderr appended to `log_path`.
struct ClusterProcess {
  std::string name;
  std::string log_path;
  pid_t pid = -1;
  // Set once the process has been reaped.
  std::optional<int> wait_status;
  bool running() const { return pid > 0 && !wait_status.has_value(); }
};

// Thread contract: not thread-safe; use it from the test's thread. client() may be shared with
// other threads (CoordinatorClient is thread-safe) while the coordinator runs.
//
// Invariant: every process ever started is in processes_ (coordinator first, if any), and the
// destructor SIGKILLs the process group of each one that was not reaped.
// SUCCEEDED, FAILED or CANCELLED: no edge leaves them.
bool IsFinalJobState(v1::JobState state);

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options = {});
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Picks a free loopback port for the coordinator now, so that workers can be started (and
  // pointed at it) before the coordinator runs. StartCoordinator() uses a picked port.
  absl::Status ReserveCoordinatorPort();

  // Starts the coordinator (on the reserved or previous port if there is one, else a free one)
  // and waits until it has written its port file. The state dir survives restarts.
  absl::Status StartCoordinator();
  // Sends `signal` to the coordinator and waits (stop deadline) until it exited; with SIGTERM
  // the exit status must be 0. The port is kept for the next StartCoordinator().
  absl::Status StopCoordinator(int signal = SIGTERM);

  // StartCoordinator(), `count` workers named worker-0.., and WaitForIdleWorkers(count).
  absl::Status Start(int count);

  // Starts one worker process pointed at the coordinator's target; returns its index.
  absl::StatusOr<int> StartWorker(const std::string& name);
  // The same, with `extra_flags` after every worker's flags and `extra_env` ("NAME=value")
  // added to its environment. A non-empty `wrapper` is a command the worker runs under, its
  // first element an absolute path that execs the rest of its arguments and then the worker's
  // command line in the same process, e.g. {"/usr/bin/prlimit", "--fsize=1000000", "--"}.
  absl::StatusOr<int> StartWorker(const std::string& name,
                                  const std::vector<std::string>& extra_flags,
                                  const std::vector<std::string>& extra_env,
                                  const std::vector<std::string>& wrapper = {});
  // Sends `signal` (e.g. SIGKILL, SIGTERM) to worker `index`; does not wait.
  absl::Status KillWorker(int index, int signal);
  // Waits until worker `index` exited and returns its wait status (see <sys/wait.h>).
  absl::StatusOr<int> WaitForWorkerExit(int index, absl::Duration deadline);
  // Waits until worker `index` is stopped (SIGSTOP, e.g. by a test hook of its own). An error if
  // it exits instead.
  absl::Status WaitForWorkerStopped(int index, absl::Duration deadline);

  // SIGTERM to every worker, then to the coordinator; waits for each (stop deadline), SIGKILLs
  // what is left. Errors if any process had to be killed or exited with a failure status.
  absl::Status StopAll();

  // Polls `predicate` (every 20 ms) until it returns true or `deadline` passes; the error names
  // `what` and the log tails of the processes.
  absl::Status WaitFor(const std::function<bool()>& predicate, absl::Duration deadline,
                       absl::string_view what);
  // Polls job `job_id` (GetJob) until `done` holds for it and returns the job as then seen; the
  // error names `what` and the job last seen.
  absl::StatusOr<v1::Job> WaitForJob(const std::string& job_id,
                                     const std::function<bool(const v1::Job&)>& done,
                                     absl::Duration deadline, absl::string_view what);
  // Waits until the coordinator lists workers with each of `names` in `state`.
  absl::Status WaitForWorkerStates(const std::vector<std::string>& names, v1::WorkerState state,
                                   absl::Duration deadline);
  absl::Status WaitForIdleWorkers(int count, absl::Duration deadline);
  // Waits until the coordinator lists exactly the workers `ids` BUSY (e.g. a generation's, back
  // under their ids after a coordinator restart: adopted).
  absl::Status WaitForBusyWorkerIds(const std::set<std::string>& ids, absl::Duration deadline);

  // The coordinator's current view of the worker named `name` (NOT_FOUND if it has none).
  absl::StatusOr<v1::WorkerInfo> FindWorker(const std::string& name);
  // The index (as in worker_process()) of the local worker the coordinator knows as `worker_id`
  // (workers are named worker-<index>); NOT_FOUND if none is.
  absl::StatusOr<int> WorkerIndexOf(const std::string& worker_id);
  // The whole event history of job `job_id`, which has ended (WatchJob from the start returns
  // when the job's last event is sent).
  absl::StatusOr<std::vector<v1::JobEvent>> JobEvents(const std::string& job_id);

  // host:port of the coordinator (empty before a port is known).
  const std::string& coordinator_target() const { return target_; }
  int metrics_port() const { return metrics_port_; }
  // A client of the coordinator (valid once a port is known).
  client::CoordinatorClient& client() { return *client_; }

  const ClusterProcess& coordinator_process() const;
  const ClusterProcess& worker_process(int index) const;
  int worker_count() const { return static_cast<int>(worker_indices_.size()); }
  const std::string& base_dir() const { return base_dir_; }
  // The --checkpoint_root of the coordinator and every worker.
  const std::string& checkpoint_root() const { return checkpoint_root_; }

  // The last `lines` lines of every process's log, for failure messages.
  std::string LogTails(int lines = 15) const;

  // Path of a binary in the test's runfiles, e.g.
  // RunfilePath("apps/coordinator/zeroshard-coordinator").
  static std::string RunfilePath(absl::string_view relative);

 private:
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                              const std::vector<std::string>& extra_env);
  // Reaps `process` if it exited (non-blocking). True while it still runs.
  static bool Poll(ClusterProcess& process);
  // Waits until `process` exited (polling until `deadline`); false on timeout.
  static bool WaitForExit(ClusterProcess& process, absl::Time deadline);
  // Sets target_ and makes client_ with options_.security's client credentials.
  absl::Status SetTarget(int grpc_port);

  const LocalClusterOptions options_;
  std::string base_dir_;
  std::string state_dir_;
  std::string port_file_;
  std::string checkpoint_root_;
  int grpc_port_ = 0;  // 0: none chosen yet
  int metrics_port_ = 0;
  std::string target_;
  std::unique_ptr<client::CoordinatorClient> client_;
  std::vector<ClusterProcess> processes_;
  std::optional<int> coordinator_index_;  // into processes_, of the latest coordinator
  std::vector<int> worker_indices_;       // into processes_, by worker index
  int coordinator_starts_ = 0;
};

// Prints every process's log tail when the current test has failed; declare it after the
// cluster so it runs first on the way out.
class LogTailsOnFailure {
 public:
  explicit LogTailsOnFailure(const LocalCluster& cluster) : cluster_(cluster) {}
  ~LogTailsOnFailure();

 private:
  const LocalCluster& cluster_;
};

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
