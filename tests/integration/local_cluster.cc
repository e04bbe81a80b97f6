// LocalCluster: spawns the coordinator and worker binaries with posix_spawn, each in its own
// process group, and waits on their state by polling with deadlines.
#include "tests/integration/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/free_port.h"
#include "gtest/gtest.h"
#include "security/coordinator_channel.h"

extern char** environ;

namespace zeroshard::testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(20);

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

absl::Status ErrnoError(absl::string_view what, int error) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(error)));
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

std::vector<std::string> LastLines(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(std::move(line));
  if (static_cast<int>(all.size()) > lines) all.erase(all.begin(), all.end() - lines);
  return all;
}

// Reads "GRPC_PORT METRICS_PORT" from the coordinator's port file (written atomically).
std::optional<std::pair<int, int>> ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  int grpc_port = 0;
  int metrics_port = 0;
  if (!(in >> grpc_port >> metrics_port) || grpc_port <= 0) return std::nullopt;
  return std::make_pair(grpc_port, metrics_port);
}

}  // namespace

LocalCluster::LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {
  base_dir_ = options_.base_dir;
  if (base_dir_.empty()) {
    std::string tmp = Env("TEST_TMPDIR");
    if (tmp.empty()) tmp = std::filesystem::temp_directory_path().string();
    std::string pattern = tmp + "/local_cluster_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) base_dir_ = pattern;
  }
  std::filesystem::create_directories(base_dir_);
  state_dir_ = base_dir_ + "/coordinator-state";
  port_file_ = base_dir_ + "/coordinator.ports";
  checkpoint_root_ = base_dir_ + "/checkpoints";
  std::filesystem::create_directories(checkpoint_root_);
  std::filesystem::create_directories(state_dir_);
}

LocalCluster::~LocalCluster() {
  for (ClusterProcess& process : processes_) {
    if (!process.running()) continue;
    killpg(process.pid, SIGKILL);
    int status = 0;
    waitpid(process.pid, &status, 0);
    process.wait_status = status;
  }
}

std::string LocalCluster::RunfilePath(absl::string_view relative) {
  return absl::StrCat(Env("TEST_SRCDIR"), "/zeroshard/", relative);
}

absl::StatusOr<pid_t> LocalCluster::Spawn(const std::vector<std::string>& argv,
                                          const std::string& log_path,
                                          const std::vector<std::string>& extra_env) {
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(argv[0], " is not an executable; is it in the test's `data`?"));
  }
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attributes);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // Its own process group (so killpg reaches its children too), default signal handling and an
  // empty signal mask whatever the test process has.
  sigset_t empty_mask;
  sigset_t default_signals;
  sigemptyset(&empty_mask);
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGTERM);
  sigaddset(&default_signals, SIGINT);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setsigmask(&attributes, &empty_mask);
  posix_spawnattr_setsigdefault(&attributes, &default_signals);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) env_strings.emplace_back(*entry);
  for (const std::string& extra : extra_env) env_strings.push_back(extra);
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  std::vector<char*> argvp;
  for (std::string& arg : argv_copy) argvp.push_back(arg.data());
  argvp.push_back(nullptr);

  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, argvp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) return ErrnoError(absl::StrCat("posix_spawn ", argv[0]), error);
  return pid;
}

bool LocalCluster::Poll(ClusterProcess& process) {
  if (!process.running()) return false;
  int status = 0;
  const pid_t reaped = waitpid(process.pid, &status, WNOHANG);
  if (reaped == process.pid) {
    process.wait_status = status;
    return false;
  }
  return true;
}

bool LocalCluster::WaitForExit(ClusterProcess& process, absl::Time deadline) {
  while (Poll(process)) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(kPollInterval);
  }
  return true;
}

absl::Status LocalCluster::SetTarget(int grpc_port) {
  if (grpc_port == grpc_port_ && client_ != nullptr) return absl::OkStatus();
  grpc_port_ = grpc_port;
  target_ = absl::StrCat("127.0.0.1:", grpc_port);
  const LocalClusterSecurity& security = options_.security;
  security::ClientCredentials credentials;
  credentials.tls.ca_file = security.ca_file;
  credentials.tls.cert_file = security.client_cert_file;
  credentials.tls.key_file = security.client_key_file;
  credentials.token = security.client_token;
  absl::StatusOr<std::unique_ptr<client::CoordinatorClient>> client =
      client::CoordinatorClient::Create(target_, credentials, absl::Seconds(10));
  if (!client.ok()) return client.status();
  client_ = *std::move(client);
  return absl::OkStatus();
}

absl::Status LocalCluster::ReserveCoordinatorPort() {
  if (grpc_port_ != 0) return absl::FailedPreconditionError("the coordinator port is already set");
  absl::StatusOr<int> port = common::PickFreeLoopbackPort();
  if (!port.ok()) return port.status();
  return SetTarget(*port);
}

absl::Status LocalCluster::StartCoordinator() {
  if (coordinator_index_.has_value() && processes_[*coordinator_index_].running()) {
    return absl::FailedPreconditionError("the coordinator already runs");
  }
  std::filesystem::remove(port_file_);
  std::vector<std::string> argv = {
      RunfilePath("apps/coordinator/zeroshard-coordinator"),
      absl::StrCat("--listen=127.0.0.1:", grpc_port_),
      "--metrics_port=0",
      "--state_dir=" + state_dir_,
      "--checkpoint_root=" + checkpoint_root_,
      "--port_file=" + port_file_,
      absl::StrCat("--heartbeat_period=", absl::FormatDuration(options_.heartbeat_period)),
      absl::StrCat("--missed_heartbeats=", options_.missed_heartbeats),
  };
  const LocalClusterSecurity& security = options_.security;
  if (!security.tls_cert_file.empty()) {
    argv.push_back("--tls_cert_file=" + security.tls_cert_file);
    argv.push_back("--tls_key_file=" + security.tls_key_file);
  }
  if (!security.tls_client_ca_file.empty()) {
    argv.push_back("--tls_client_ca_file=" + security.tls_client_ca_file);
  }
  if (security.require_client_cert) argv.push_back("--tls_require_client_cert");
  if (!security.token_file.empty()) argv.push_back("--token_file=" + security.token_file);
  argv.insert(argv.end(), options_.extra_coordinator_flags.begin(),
              options_.extra_coordinator_flags.end());
  ClusterProcess process;
  process.name = "coordinator";
  process.log_path = absl::StrCat(base_dir_, "/coordinator.", coordinator_starts_++, ".log");
  absl::StatusOr<pid_t> pid = Spawn(argv, process.log_path, {});
  if (!pid.ok()) return pid.status();
  process.pid = *pid;
  processes_.push_back(process);
  coordinator_index_ = static_cast<int>(processes_.size()) - 1;

  ClusterProcess& coordinator = processes_[*coordinator_index_];
  std::optional<std::pair<int, int>> ports;
  const absl::Time deadline = absl::Now() + options_.start_deadline;
  while (!(ports = ReadPortFile(port_file_)).has_value()) {
    if (!Poll(coordinator)) {
      return absl::InternalError(absl::StrCat("the coordinator exited before serving (",
                                              DescribeWaitStatus(*coordinator.wait_status), ")\n",
                                              LogTails()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("the coordinator wrote no port file within ",
                                                      absl::FormatDuration(options_.start_deadline),
                                                      "\n", LogTails()));
    }
    absl::SleepFor(kPollInterval);
  }
  metrics_port_ = ports->second;
  return SetTarget(ports->first);
}

absl::Status LocalCluster::StopCoordinator(int signal) {
  if (!coordinator_index_.has_value() || !processes_[*coordinator_index_].running()) {
    return absl::FailedPreconditionError("the coordinator does not run");
  }
  ClusterProcess& coordinator = processes_[*coordinator_index_];
  killpg(coordinator.pid, signal);
  if (!WaitForExit(coordinator, absl::Now() + options_.stop_deadline)) {
    killpg(coordinator.pid, SIGKILL);
    WaitForExit(coordinator, absl::InfiniteFuture());
    return absl::DeadlineExceededError(absl::StrCat("the coordinator did not exit within ",
                                                    absl::FormatDuration(options_.stop_deadline),
                                                    " of signal ", signal));
  }
  const int status = *coordinator.wait_status;
  if (signal == SIGTERM && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    return absl::InternalError(absl::StrCat(
        "the coordinator ended with ", DescribeWaitStatus(status), " after SIGTERM\n", LogTails()));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Start(int count) {
  if (absl::Status started = StartCoordinator(); !started.ok()) return started;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<int> index = StartWorker(absl::StrCat("worker-", i));
    if (!index.ok()) return index.status();
  }
  return WaitForIdleWorkers(count, options_.start_deadline);
}

absl::StatusOr<int> LocalCluster::StartWorker(const std::string& name) {
  return StartWorker(name, {}, {});
}

absl::StatusOr<int> LocalCluster::StartWorker(const std::string& name,
                                              const std::vector<std::string>& extra_flags,
                                              const std::vector<std::string>& extra_env,
                                              const std::vector<std::string>& wrapper) {
  if (target_.empty()) {
    return absl::FailedPreconditionError(
        "no coordinator address yet: StartCoordinator() or ReserveCoordinatorPort() first");
  }
  std::vector<std::string> argv = {
      RunfilePath("worker/zeroshard-worker"),
      "--coordinator=" + target_,
      "--device=cpu",
      "--name=" + name,
      absl::StrCat("--threads=", options_.worker_threads),
      "--checkpoint_root=" + checkpoint_root_,
  };
  if (!options_.security.ca_file.empty()) argv.push_back("--ca=" + options_.security.ca_file);
  if (!options_.security.worker_token_file.empty()) {
    argv.push_back("--token_file=" + options_.security.worker_token_file);
  }
  argv.insert(argv.end(), options_.extra_worker_flags.begin(), options_.extra_worker_flags.end());
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  argv.insert(argv.begin(), wrapper.begin(), wrapper.end());
  ClusterProcess process;
  process.name = name;
  process.log_path = absl::StrCat(base_dir_, "/", name, ".", processes_.size(), ".log");
  // Workers share the cores: single-threaded BLAS (docs/design.md, "OpenBLAS"); the
  // OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE hints come through the inherited environment.
  std::vector<std::string> env = {"OPENBLAS_NUM_THREADS=1"};
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  absl::StatusOr<pid_t> pid = Spawn(argv, process.log_path, env);
  if (!pid.ok()) return pid.status();
  process.pid = *pid;
  processes_.push_back(process);
  worker_indices_.push_back(static_cast<int>(processes_.size()) - 1);
  return static_cast<int>(worker_indices_.size()) - 1;
}

absl::Status LocalCluster::KillWorker(int index, int signal) {
  if (index < 0 || index >= worker_count()) {
    return absl::OutOfRangeError(absl::StrCat("no worker ", index));
  }
  ClusterProcess& process = processes_[worker_indices_[index]];
  if (!Poll(process)) {
    return absl::FailedPreconditionError(absl::StrCat(process.name, " has already exited"));
  }
  if (killpg(process.pid, signal) != 0) return ErrnoError("killpg", errno);
  return absl::OkStatus();
}

absl::StatusOr<int> LocalCluster::WaitForWorkerExit(int index, absl::Duration deadline) {
  if (index < 0 || index >= worker_count()) {
    return absl::OutOfRangeError(absl::StrCat("no worker ", index));
  }
  ClusterProcess& process = processes_[worker_indices_[index]];
  if (!WaitForExit(process, absl::Now() + deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        process.name, " still runs after ", absl::FormatDuration(deadline), "\n", LogTails()));
  }
  return *process.wait_status;
}

absl::Status LocalCluster::WaitForWorkerStopped(int index, absl::Duration deadline) {
  if (index < 0 || index >= worker_count()) {
    return absl::OutOfRangeError(absl::StrCat("no worker ", index));
  }
  ClusterProcess& process = processes_[worker_indices_[index]];
  const absl::Time end = absl::Now() + deadline;
  while (process.running()) {
    int status = 0;
    const pid_t reaped = waitpid(process.pid, &status, WNOHANG | WUNTRACED);
    if (reaped == process.pid && WIFSTOPPED(status)) return absl::OkStatus();
    if (reaped == process.pid) {
      process.wait_status = status;
      break;
    }
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(absl::StrCat(
          process.name, " did not stop within ", absl::FormatDuration(deadline), "\n", LogTails()));
    }
    absl::SleepFor(kPollInterval);
  }
  return absl::FailedPreconditionError(absl::StrCat(process.name, " ended (",
                                                    DescribeWaitStatus(*process.wait_status),
                                                    ") instead of stopping\n", LogTails()));
}

absl::Status LocalCluster::StopAll() {
  std::vector<std::string> problems;
  auto stop_group = [&](const std::vector<int>& indices) {
    for (int i : indices) {
      if (Poll(processes_[i])) killpg(processes_[i].pid, SIGTERM);
    }
    const absl::Time deadline = absl::Now() + options_.stop_deadline;
    for (int i : indices) {
      ClusterProcess& process = processes_[i];
      const bool was_running = process.running();
      if (!WaitForExit(process, deadline)) {
        killpg(process.pid, SIGKILL);
        WaitForExit(process, absl::InfiniteFuture());
        problems.push_back(absl::StrCat(process.name, " needed SIGKILL"));
      } else if (was_running &&
                 !(WIFEXITED(*process.wait_status) && WEXITSTATUS(*process.wait_status) == 0)) {
        problems.push_back(
            absl::StrCat(process.name, " ended with ", DescribeWaitStatus(*process.wait_status)));
      }
    }
  };
  std::vector<int> workers;
  std::vector<int> coordinators;
  for (int i = 0; i < static_cast<int>(processes_.size()); ++i) {
    (processes_[i].name == "coordinator" ? coordinators : workers).push_back(i);
  }
  stop_group(workers);
  stop_group(coordinators);
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("StopAll: ", absl::StrJoin(problems, "; "), "\n", LogTails()));
}

absl::Status LocalCluster::WaitFor(const std::function<bool()>& predicate, absl::Duration deadline,
                                   absl::string_view what) {
  const absl::Time end = absl::Now() + deadline;
  while (!predicate()) {
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(absl::StrCat("not within ", absl::FormatDuration(deadline),
                                                      ": ", what, "\n", LogTails()));
    }
    absl::SleepFor(kPollInterval);
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForBusyWorkerIds(const std::set<std::string>& ids,
                                                absl::Duration deadline) {
  if (client_ == nullptr) return absl::FailedPreconditionError("no coordinator address yet");
  return WaitFor(
      [&] {
        absl::StatusOr<std::vector<v1::WorkerInfo>> busy = client_->ListWorkers(v1::BUSY);
        if (!busy.ok()) return false;
        std::set<std::string> seen;
        for (const v1::WorkerInfo& worker : *busy) seen.insert(worker.id());
        return seen == ids;
      },
      deadline, absl::StrCat("exactly workers {", absl::StrJoin(ids, ","), "} BUSY"));
}

absl::Status LocalCluster::WaitForWorkerStates(const std::vector<std::string>& names,
                                               v1::WorkerState state, absl::Duration deadline) {
  if (client_ == nullptr) return absl::FailedPreconditionError("no coordinator address yet");
  const std::set<std::string> wanted(names.begin(), names.end());
  std::string last_seen = "(no answer)";
  auto all_in_state = [&] {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers(state);
    if (!workers.ok()) {
      last_seen = workers.status().ToString();
      return false;
    }
    std::set<std::string> seen;
    for (const v1::WorkerInfo& worker : *workers) {
      if (wanted.count(worker.name()) > 0) seen.insert(worker.name());
    }
    last_seen = absl::StrJoin(seen, ",");
    return seen == wanted;
  };
  absl::Status status = WaitFor(
      all_in_state, deadline,
      absl::StrCat("workers {", absl::StrJoin(names, ","), "} ", v1::WorkerState_Name(state)));
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("in state ", v1::WorkerState_Name(state), " were only {",
                                     last_seen, "}; ", status.message()));
  }
  return status;
}

bool IsFinalJobState(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

absl::StatusOr<v1::Job> LocalCluster::WaitForJob(const std::string& job_id,
                                                 const std::function<bool(const v1::Job&)>& done,
                                                 absl::Duration deadline, absl::string_view what) {
  v1::Job last;
  absl::Status status = WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = client().GetJob(job_id);
        if (!job.ok()) return false;
        last = *std::move(job);
        return done(last);
      },
      deadline, absl::StrCat(job_id, ": ", what));
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("last seen: ", last.ShortDebugString(), "\n",
                                                    status.message()));
  }
  return last;
}

absl::Status LocalCluster::WaitForIdleWorkers(int count, absl::Duration deadline) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.push_back(absl::StrCat("worker-", i));
  return WaitForWorkerStates(names, v1::IDLE, deadline);
}

absl::StatusOr<v1::WorkerInfo> LocalCluster::FindWorker(const std::string& name) {
  if (client_ == nullptr) return absl::FailedPreconditionError("no coordinator address yet");
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers =
      client_->ListWorkers(v1::WORKER_STATE_UNSPECIFIED);
  if (!workers.ok()) return workers.status();
  // Newest registration wins when a name registered more than once (ids increase).
  std::optional<v1::WorkerInfo> found;
  for (const v1::WorkerInfo& worker : *workers) {
    if (worker.name() == name && (!found.has_value() || worker.id() > found->id())) found = worker;
  }
  if (!found.has_value()) return absl::NotFoundError(absl::StrCat("no worker named ", name));
  return *found;
}

absl::StatusOr<int> LocalCluster::WorkerIndexOf(const std::string& worker_id) {
  for (int index = 0; index < worker_count(); ++index) {
    absl::StatusOr<v1::WorkerInfo> info = FindWorker(absl::StrCat("worker-", index));
    if (info.ok() && info->id() == worker_id) return index;
  }
  return absl::NotFoundError(absl::StrCat("no local worker is ", worker_id));
}

absl::StatusOr<std::vector<v1::JobEvent>> LocalCluster::JobEvents(const std::string& job_id) {
  if (client_ == nullptr) return absl::FailedPreconditionError("no coordinator address yet");
  std::vector<v1::JobEvent> events;
  absl::Status watched =
      client_->WatchJob(job_id, 0, [&](const v1::JobEvent& event) { events.push_back(event); });
  if (!watched.ok()) return watched;
  return events;
}

const ClusterProcess& LocalCluster::coordinator_process() const {
  return processes_.at(coordinator_index_.value());
}

const ClusterProcess& LocalCluster::worker_process(int index) const {
  return processes_.at(worker_indices_.at(index));
}

std::string LocalCluster::LogTails(int lines) const {
  std::ostringstream out;
  for (const ClusterProcess& process : processes_) {
    out << "--- " << process.name << " (" << process.log_path << ") ---\n";
    for (const std::string& line : LastLines(process.log_path, lines)) out << "  " << line << "\n";
  }
  return out.str();
}

LogTailsOnFailure::~LogTailsOnFailure() {
  if (::testing::Test::HasFailure()) std::cerr << cluster_.LogTails(40);
}

}  // namespace zeroshard::testing
