// Hostile load benchmark: the heartbeat load of coordinator_load, first alone (baseline), then
// while 1,000 WatchJob streams on quiet jobs, 1,000 StoreGets parked on keys that never appear
// and slow and idle connections to the metrics port are held open. Measures heartbeat latency,
// /healthz and /metrics answer times, and the process's RSS and threads in both phases. Prints
// one JSON object per phase and a summary ("bench":"hostile_load") per round.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "http/http_test_client.h"
#include "tests/bench/coordinator_load_lib.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

ABSL_FLAG(int, workers, 5000, "Simulated workers, each heartbeating on its own.");
ABSL_FLAG(int, duration_s, 10, "Seconds of heartbeats per phase.");
ABSL_FLAG(int, channels, 8, "Client channels the workers (and the watches) are spread over.");
ABSL_FLAG(int, client_threads, 2, "Threads pacing the periodic heartbeats.");
ABSL_FLAG(int, watches, 1000, "WatchJob streams held open (all from 127.0.0.1, one peer).");
ABSL_FLAG(int, parked_gets, 1000, "StoreGets parked on keys that never appear.");
ABSL_FLAG(int, slow_http, 64, "Metrics-port clients sending one byte of a request every 1-2 s.");
ABSL_FLAG(int, idle_http, 16, "Metrics-port connections that send nothing.");
ABSL_FLAG(int, quiet_jobs, 4, "RUNNING 2-worker jobs (no progress) the watches and Gets use.");
ABSL_FLAG(absl::Duration, probe_interval, absl::Milliseconds(100),
          "Pause between /healthz + /metrics probe pairs.");
ABSL_FLAG(int, setup_s, 10,
          "Seconds of heartbeats while the held calls are opened (longer than their set-up).");
ABSL_FLAG(std::string, coordinator_binary, "",
          "Run this zeroshard-coordinator as a child process (with --security's TLS and token "
          "flags) instead of in-process, so that RSS and threads are the coordinator's alone.");
ABSL_FLAG(std::string, security, "plaintext",
          "plaintext, tls_tokens or both (as coordinator_load).");
ABSL_FLAG(int, rounds, 1,
          "Rounds; each runs every --security configuration on a fresh coordinator.");

namespace zeroshard::bench {
namespace {

constexpr int kQuietJobWorkers = 2;
// Parked Gets wait this long (the store's longest wait is 10 minutes); far past any run.
constexpr absl::Duration kParkedGetWait = absl::Minutes(9);

// A line "Name:   value kB" of /proc/<pid>/status (pid 0: this process), as a number; -1 when
// absent.
int64_t ProcStatus(pid_t pid, const std::string& name) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::vector<std::string> fields =
        absl::StrSplit(line.substr(name.size() + 1), ' ', absl::SkipWhitespace());
    int64_t value = -1;
    if (!fields.empty() && absl::SimpleAtoi(fields[0], &value)) return value;
  }
  return -1;
}

// The coordinator under test: in this process (its RSS and threads then include the simulated
// clients'), or a zeroshard-coordinator child process (--coordinator_binary, given the same TLS
// files and token file as flags), whose RSS and threads are the coordinator's alone.
// Thread contract: Start and destroy on one thread; the accessors from any.
class CoordinatorUnderTest {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorUnderTest>> Start(
      coordinator::CoordinatorServerOptions options, const std::string& binary) {
    std::unique_ptr<CoordinatorUnderTest> started(new CoordinatorUnderTest());
    if (binary.empty()) {
      ZS_ASSIGN_OR_RETURN(started->server_, coordinator::CoordinatorServer::Start(options));
      started->target_ = started->server_->grpc_target();
      started->metrics_port_ = started->server_->metrics_port();
      return started;
    }
    const std::string port_file = options.state_dir + "/ports";
    const std::string log = options.state_dir + ".log";
    std::vector<std::string> args = {binary, "--listen=127.0.0.1:0", "--metrics_port=0",
                                     "--state_dir=" + options.state_dir,
                                     "--port_file=" + port_file};
    // The same security as an in-process coordinator gets from `options`.
    if (options.tls.enabled()) {
      args.push_back("--tls_cert_file=" + options.tls.cert_file);
      args.push_back("--tls_key_file=" + options.tls.key_file);
      if (!options.tls.client_ca_file.empty()) {
        args.push_back("--tls_client_ca_file=" + options.tls.client_ca_file);
      }
      if (options.tls.require_client_cert) args.push_back("--tls_require_client_cert");
    }
    if (!options.token_file.empty()) args.push_back("--token_file=" + options.token_file);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int spawned =
        posix_spawn(&started->pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      started->pid_ = 0;
      return absl::InternalError(
          absl::StrCat("cannot start ", binary, ": ", std::strerror(spawned)));
    }
    // The port file appears (renamed into place whole) once the coordinator serves.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int grpc_port = 0;
    while (true) {
      std::ifstream ports(port_file);
      if (ports >> grpc_port >> started->metrics_port_) break;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(binary, " wrote no port file; see ", log));
      }
      absl::SleepFor(absl::Milliseconds(20));  // a file has no condition to wait on
    }
    started->target_ = absl::StrCat("127.0.0.1:", grpc_port);
    return started;
  }

  ~CoordinatorUnderTest() {
    if (server_ != nullptr) server_->Shutdown();
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }

  const std::string& target() const { return target_; }
  int metrics_port() const { return metrics_port_; }
  const char* where() const { return pid_ > 0 ? "process" : "in_process"; }
  double RssMb() const { return static_cast<double>(ProcStatus(pid_, "VmRSS")) / 1024.0; }
  int64_t Threads() const { return ProcStatus(pid_, "Threads"); }

  // Gets parked in the store; -1 when the coordinator is another process (no gauge says).
  int64_t ParkedGets() const {
    return server_ != nullptr ? server_->rendezvous()->PendingWaiters() : -1;
  }
  // Whether `count` Gets are parked by `deadline`; a child process's are not visible: true.
  bool AwaitParkedGets(int64_t count, absl::Time deadline) const {
    if (server_ == nullptr) return true;
    return server_->rendezvous()->AwaitPendingWaiters(
        count, std::max(absl::ZeroDuration(), deadline - absl::Now()));
  }

 private:
  CoordinatorUnderTest() = default;

  std::unique_ptr<coordinator::CoordinatorServer> server_;
  pid_t pid_ = 0;
  std::string target_;
  int metrics_port_ = -1;
};

// Probes /healthz and /metrics (each on a fresh connection) every probe interval and samples
// the process's RSS and threads, until stopped. Thread contract: construct, Stop once, then
// read the results, all on one thread.
class Prober {
 public:
  explicit Prober(const CoordinatorUnderTest* coordinator)
      : coordinator_(coordinator), port_(coordinator->metrics_port()) {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_.Notify();
    thread_.join();
  }

  std::vector<double> latencies_ms[2];
  int errors[2] = {0, 0};
  double rss_mb_max = 0;
  int64_t threads_max = 0;

 private:
  void Run() {
    const char* paths[] = {"/healthz", "/metrics"};
    do {
      for (int p = 0; p < 2; ++p) {
        const absl::Time start = absl::Now();
        absl::StatusOr<http::testing::HttpReply> reply =
            http::testing::Get(port_, paths[p], start + absl::Seconds(10));
        if (reply.ok() && reply->status == 200) {
          latencies_ms[p].push_back(Ms(absl::Now() - start));
        } else {
          ++errors[p];
        }
      }
      rss_mb_max = std::max(rss_mb_max, coordinator_->RssMb());
      threads_max = std::max(threads_max, coordinator_->Threads());
      // Pacing, not waiting for state: Stop ends the pause early.
    } while (!stop_.WaitForNotificationWithTimeout(absl::GetFlag(FLAGS_probe_interval)));
  }

  const CoordinatorUnderTest* const coordinator_;
  const int port_;
  absl::Notification stop_;
  std::thread thread_;
};

// Open streams and calls of the hostile phase: counts of those established and of those
// finished. Thread-safe.
class HeldCalls {
 public:
  void Established() {
    absl::MutexLock lock(&mu_);
    ++established_;
  }
  void Finished(bool was_established) {
    absl::MutexLock lock(&mu_);
    ++finished_;
    if (was_established) --established_;
  }
  int64_t established() const {
    absl::MutexLock lock(&mu_);
    return established_;
  }
  int64_t finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  bool AwaitEstablished(int64_t count, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return established_ >= count; };
    return mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
  }
  bool AwaitFinished(int64_t count, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return finished_ >= count; };
    return mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
  }

 private:
  mutable absl::Mutex mu_;
  int64_t established_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
};

// One WatchJob stream from the start of a quiet job's history; established once the first
// event arrives. Thread contract: Start once; gRPC threads run the reactions.
class Watch final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  explicit Watch(HeldCalls* held) : held_(held) {}
  void Start(v1::Coordinator::Stub& stub, const std::string& job_id) {
    request_.set_job_id(job_id);
    stub.async()->WatchJob(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (!established_.exchange(true)) held_->Established();
    StartRead(&event_);
  }
  void OnDone(const grpc::Status&) override { held_->Finished(established_.load()); }

 private:
  HeldCalls* const held_;
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::JobEvent event_;
  std::atomic<bool> established_{false};
};

// One StoreGet on a key that is never set. Thread contract: as Watch.
struct ParkedGet {
  grpc::ClientContext context;
  v1::StoreGetRequest request;
  v1::StoreGetResponse response;
};

struct PhaseResult {
  double p50_ms = 0;
  double p99_ms = 0;
  int64_t errors = 0;
  double rss_mb = 0;
  int64_t threads = 0;
  double healthz_ms_max = 0;
  double metrics_ms_max = 0;
};

// Periodic heartbeats for --duration_s while the prober runs; prints the phase's line.
PhaseResult HeartbeatPhase(LoadBench& bench, const CoordinatorUnderTest& coordinator,
                           absl::Duration period, const char* security, int round,
                           const char* phase, int64_t watches, int64_t parked_gets, int slow_http,
                           int idle_http) {
  Prober prober(&coordinator);
  CallLog log;
  bench.PeriodicHeartbeats(period, absl::Seconds(absl::GetFlag(FLAGS_duration_s)),
                           absl::GetFlag(FLAGS_client_threads), log);
  prober.Stop();
  PhaseResult result;
  result.p50_ms = log.QuantileMs(0.5);
  result.p99_ms = log.QuantileMs(0.99);
  result.errors = log.errors() + prober.errors[0] + prober.errors[1];
  result.rss_mb = prober.rss_mb_max;
  result.threads = prober.threads_max;
  result.healthz_ms_max = Quantile(prober.latencies_ms[0], 1.0);
  result.metrics_ms_max = Quantile(prober.latencies_ms[1], 1.0);
  std::printf(
      "{\"bench\":\"hostile_load_phase\",\"security\":\"%s\",\"round\":%d,\"phase\":\"%s\","
      "\"workers\":%lld,\"heartbeats\":%lld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"errors\":%lld,"
      "\"rss_mb\":%.1f,\"threads\":%lld,\"probes\":%zu,\"probe_errors\":%d,"
      "\"healthz_ms_p50\":%.3f,\"healthz_ms_max\":%.3f,\"metrics_ms_p50\":%.3f,"
      "\"metrics_ms_max\":%.3f,\"watches\":%lld,\"parked_gets\":%lld,\"slow_http\":%d,"
      "\"idle_http\":%d}\n",
      security, round, phase, static_cast<long long>(bench.workers()),
      static_cast<long long>(log.count()), result.p50_ms, result.p99_ms,
      static_cast<long long>(result.errors), result.rss_mb, static_cast<long long>(result.threads),
      prober.latencies_ms[0].size(), prober.errors[0] + prober.errors[1],
      Quantile(prober.latencies_ms[0], 0.5), result.healthz_ms_max,
      Quantile(prober.latencies_ms[1], 0.5), result.metrics_ms_max, static_cast<long long>(watches),
      static_cast<long long>(parked_gets), slow_http, idle_http);
  std::fflush(stdout);
  return result;
}

absl::Status RunRound(Security security, int round, const std::string& pki_dir) {
  const char* name = SecurityName(security);
  char state_template[] = "/tmp/zeroshard-hostile-load-XXXXXX";
  const char* state_dir = mkdtemp(state_template);
  if (state_dir == nullptr) return absl::InternalError("mkdtemp failed");
  // Declared before the server (in-process or child), so removed after it stops, on every return.
  absl::Cleanup remove_state_dir = [state_dir] {
    std::filesystem::remove_all(state_dir);
    std::filesystem::remove(std::string(state_dir) + ".log");
  };
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = 0;
  options.state_dir = state_dir;
  security::ClientCredentials worker_credentials;
  security::ClientCredentials viewer_credentials;
  if (security == Security::kTlsTokens) {
    ZS_ASSIGN_OR_RETURN(BenchCredentials credentials, MakeTlsAndTokens(pki_dir));
    options.tls = credentials.server_tls;
    options.token_file = credentials.token_file;
    worker_credentials = credentials.worker;
    viewer_credentials = credentials.admin;
  }
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<CoordinatorUnderTest> server,
      CoordinatorUnderTest::Start(options, absl::GetFlag(FLAGS_coordinator_binary)));
  const absl::Duration period = options.manager.lease.heartbeat_period;
  const int channels = std::max(1, absl::GetFlag(FLAGS_channels));
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<LoadBench> bench,
      LoadBench::Create(server->target(), worker_credentials, viewer_credentials, channels));
  const int64_t register_errors = bench->RegisterWorkers(absl::GetFlag(FLAGS_workers));
  if (register_errors != 0) {
    return absl::UnavailableError(absl::StrCat(register_errors, " registrations failed"));
  }
  if (security == Security::kTlsTokens) {
    // A secured figure without enforcement would measure TLS alone: refuse to produce one.
    ZS_RETURN_IF_ERROR(bench->CheckEnforcement(server->target(), worker_credentials));
    std::printf(
        "{\"bench\":\"hostile_load_enforcement\",\"security\":\"%s\",\"coordinator\":\"%s\","
        "\"round\":%d,\"no_secret\":\"PERMISSION_DENIED\",\"wrong_secret\":\"PERMISSION_DENIED\","
        "\"no_token\":\"UNAUTHENTICATED\"}\n",
        name, server->where(), round);
  }
  // The watched jobs run on simulated workers that never report progress: no events after the
  // start. Their RUNNING generation is the namespace the parked Gets wait in (the store has
  // none for a job before its first generation).
  std::vector<v1::Job> jobs;
  for (int j = 0; j < std::max(1, absl::GetFlag(FLAGS_quiet_jobs)); ++j) {
    ZS_ASSIGN_OR_RETURN(LoadBench::Scheduled scheduled,
                        bench->SubmitAndAwaitRunning(absl::StrCat("quiet-", j), kQuietJobWorkers));
    jobs.push_back(scheduled.job);
  }

  const PhaseResult baseline =
      HeartbeatPhase(*bench, *server, period, name, round, "baseline", 0, 0, 0, 0);

  // The workers keep beating while the held calls are set up (their lease is 3 periods).
  CallLog setup_log;
  std::thread setup_heartbeats([&] {
    bench->PeriodicHeartbeats(period, absl::Seconds(absl::GetFlag(FLAGS_setup_s)),
                              absl::GetFlag(FLAGS_client_threads), setup_log);
  });
  const absl::Time setup_start = absl::Now();
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> watch_stubs;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("zeroshard.bench_watch_channel", i);
    ZS_ASSIGN_OR_RETURN(
        std::shared_ptr<grpc::Channel> channel,
        security::CreateCoordinatorChannel(server->target(), viewer_credentials, args));
    watch_stubs.push_back(v1::Coordinator::NewStub(channel));
  }
  const int watch_count = absl::GetFlag(FLAGS_watches);
  HeldCalls watch_calls;
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < watch_count; ++i) {
    watches.push_back(std::make_unique<Watch>(&watch_calls));
    watches.back()->Start(*watch_stubs[i % channels], jobs[i % jobs.size()].id());
  }
  // Parked Gets go out as the job's rank 0 would send them: its worker's channel and secret.
  const int get_count = absl::GetFlag(FLAGS_parked_gets);
  HeldCalls get_calls;
  std::once_flag first_get_error;
  std::vector<std::unique_ptr<ParkedGet>> gets;
  for (int i = 0; i < get_count; ++i) {
    const v1::Job& job = jobs[i % jobs.size()];
    const int64_t worker = bench->IndexOf(job.worker_ids(0));
    auto get = std::make_unique<ParkedGet>();
    get->request.set_job_id(job.id());
    get->request.set_generation(job.generation());
    get->request.set_key(absl::StrCat("never-set-", i));
    get->request.set_timeout_ms(absl::ToInt64Milliseconds(kParkedGetWait));
    get->context.set_deadline(absl::ToChronoTime(absl::Now() + kParkedGetWait + absl::Minutes(1)));
    bench->AddWorkerSecret(worker, get->context);
    bench->StubFor(worker).async()->StoreGet(
        &get->context, &get->request, &get->response,
        [&get_calls, &first_get_error](grpc::Status status) {
          if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
            std::call_once(first_get_error, [&status] {
              std::fprintf(stderr, "hostile_load: a parked StoreGet ended: %d %s\n",
                           static_cast<int>(status.error_code()), status.error_message().c_str());
            });
          }
          get_calls.Finished(true);
        });
    gets.push_back(std::move(get));
  }
  std::vector<http::testing::RawConnection> idle;
  for (int i = 0; i < absl::GetFlag(FLAGS_idle_http); ++i) {
    ZS_ASSIGN_OR_RETURN(http::testing::RawConnection connection,
                        http::testing::RawConnection::Open(server->metrics_port()));
    idle.push_back(std::move(connection));
  }
  const int slow_count = absl::GetFlag(FLAGS_slow_http);
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<http::testing::SlowClients> slow,
                      http::testing::SlowClients::Open(server->metrics_port(), slow_count));

  const absl::Time setup_deadline = setup_start + absl::Seconds(absl::GetFlag(FLAGS_setup_s));
  const bool watches_up = watch_calls.AwaitEstablished(watch_count, setup_deadline);
  const bool gets_parked = server->AwaitParkedGets(get_count, setup_deadline);
  const bool slow_started = slow->WaitForBytes(2 * int64_t{slow_count}, setup_deadline);
  const absl::Duration setup_time = absl::Now() - setup_start;
  setup_heartbeats.join();
  if (!watches_up || !gets_parked || !slow_started) {
    std::fprintf(stderr,
                 "hostile_load: set-up incomplete: %lld of %d watches, %lld of %d Gets parked, "
                 "slow clients %s\n",
                 static_cast<long long>(watch_calls.established()), watch_count,
                 static_cast<long long>(server->ParkedGets()), get_count,
                 slow_started ? "started" : "not started");
  }

  // A child coordinator's Gets are counted as the calls still unanswered: the store answers any
  // other Get at once.
  auto gets_held_now = [&] {
    const int64_t parked = server->ParkedGets();
    return parked >= 0 ? parked : get_count - get_calls.finished();
  };
  const PhaseResult hostile =
      HeartbeatPhase(*bench, *server, period, name, round, "hostile", watch_calls.established(),
                     gets_held_now(), slow_count, static_cast<int>(idle.size()));
  // What was still held at the end of the phase; fewer means the server dropped some.
  const int64_t watches_held = watch_calls.established();
  const int64_t gets_held = gets_held_now();
  const int64_t slow_send_errors = slow->send_errors();

  for (std::unique_ptr<Watch>& watch : watches) watch->Cancel();
  for (std::unique_ptr<ParkedGet>& get : gets) get->context.TryCancel();
  const absl::Time drain_deadline = absl::Now() + absl::Seconds(60);
  const bool drained = watch_calls.AwaitFinished(watch_count, drain_deadline) &&
                       get_calls.AwaitFinished(get_count, drain_deadline);
  slow.reset();
  idle.clear();

  const int64_t errors = baseline.errors + hostile.errors + setup_log.errors() +
                         (watches_up ? 0 : 1) + (gets_parked ? 0 : 1) + (slow_started ? 0 : 1) +
                         (drained ? 0 : 1);
  std::printf(
      "{\"bench\":\"hostile_load\",\"security\":\"%s\",\"coordinator\":\"%s\",\"round\":%d,"
      "\"workers\":%lld,"
      "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"baseline_p99_ms\":%.3f,\"errors\":%lld,"
      "\"rss_baseline_mb\":%.1f,\"rss_growth_mb\":%.1f,\"threads\":%lld,"
      "\"threads_baseline\":%lld,\"healthz_ms_max\":%.3f,\"metrics_ms_max\":%.3f,"
      "\"watches\":%lld,\"parked_gets\":%lld,\"slow_http\":%d,\"slow_send_errors\":%lld,"
      "\"idle_http\":%d,\"setup_s\":%.3f,\"setup_heartbeat_errors\":%lld}\n",
      name, server->where(), round, static_cast<long long>(bench->workers()), hostile.p50_ms,
      hostile.p99_ms, baseline.p99_ms, static_cast<long long>(errors), baseline.rss_mb,
      hostile.rss_mb - baseline.rss_mb, static_cast<long long>(hostile.threads),
      static_cast<long long>(baseline.threads), hostile.healthz_ms_max, hostile.metrics_ms_max,
      static_cast<long long>(watches_held), static_cast<long long>(gets_held), slow_count,
      static_cast<long long>(slow_send_errors), absl::GetFlag(FLAGS_idle_http),
      absl::ToDoubleSeconds(setup_time), static_cast<long long>(setup_log.errors()));
  std::fflush(stdout);
  if (!drained) {
    // gRPC may still call back into calls that never finished: leak them rather than free them.
    for (std::unique_ptr<Watch>& watch : watches) watch.release();
    for (std::unique_ptr<ParkedGet>& get : gets) get.release();
  }
  watches.clear();
  gets.clear();
  bench.reset();
  server.reset();
  if (errors != 0) return absl::InternalError(absl::StrCat(errors, " errors"));
  return absl::OkStatus();
}

int Run() {
  absl::StatusOr<std::vector<Security>> configurations =
      ParseSecurityFlag(absl::GetFlag(FLAGS_security));
  if (!configurations.ok()) {
    std::fprintf(stderr, "hostile_load: %s\n", configurations.status().ToString().c_str());
    return 2;
  }
  char pki_template[] = "/tmp/zeroshard-hostile-load-pki-XXXXXX";
  const char* pki_dir = mkdtemp(pki_template);
  if (pki_dir == nullptr) {
    std::perror("hostile_load: mkdtemp");
    return 1;
  }
  absl::Cleanup remove_pki_dir = [pki_dir] { std::filesystem::remove_all(pki_dir); };
  int failed = 0;
  const size_t n = configurations->size();
  for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
    for (size_t k = 0; k < n; ++k) {
      // Alternating the order spreads the machine's drift over both configurations.
      const Security security = (*configurations)[round % 2 == 0 ? k : n - 1 - k];
      const absl::Status status = RunRound(security, round, pki_dir);
      if (!status.ok()) {
        ++failed;
        std::fprintf(stderr, "hostile_load: %s round %d: %s\n", SecurityName(security), round,
                     status.ToString().c_str());
      }
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As zeroshard-coordinator does: no lock-order cycle check on every Mutex acquisition.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return zeroshard::bench::Run();
}
