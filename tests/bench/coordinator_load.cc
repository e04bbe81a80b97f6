// Coordinator load benchmark: an in-process coordinator (real clock, real gRPC on loopback) and
// N simulated workers, each sending its own unary Heartbeat at the coordinator's period; then
// heartbeats as fast as the clients can send (saturation); then a 1,024-worker job's scheduling
// time. --security=tls_tokens runs it with TLS and a token file, the workers presenting a worker
// token and their registration's secret, after a self-check that the coordinator refuses calls
// without them (the run fails otherwise); --security=both alternates the two on fresh
// coordinators. Prints one JSON object per line: the phases of each round, then per
// configuration the summary ("bench":"coordinator_load", medians over the rounds) and, for both,
// the TLS configuration's ratios to plaintext ("bench":"coordinator_load_tls_cost").
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/status_macros.h"
#include "tests/bench/coordinator_load_lib.h"
#include "tests/bench/planner_bench_lib.h"

ABSL_FLAG(int, workers, 5000, "Simulated workers, each heartbeating on its own.");
ABSL_FLAG(int, duration_s, 10, "Seconds of heartbeats at the coordinator's period.");
ABSL_FLAG(int, saturation_s, 3, "Seconds of heartbeats as fast as the clients can send.");
ABSL_FLAG(int, channels, 8, "Client channels (connections) the workers are spread over.");
ABSL_FLAG(int, client_threads, 2, "Threads pacing the periodic heartbeats.");
ABSL_FLAG(int, saturation_in_flight, 512, "Heartbeats outstanding during saturation.");
ABSL_FLAG(bool, planner, true, "Also run the planner benchmark and print its line.");
ABSL_FLAG(std::string, security, "plaintext",
          "plaintext, tls_tokens (TLS on the gRPC port, a token file, workers with a worker token "
          "and their registration's secret) or both (the two alternate, round by round).");
ABSL_FLAG(int, rounds, 1,
          "Rounds; each runs every --security configuration once on a fresh coordinator, the "
          "order alternating from round to round.");

namespace zeroshard::bench {
namespace {

constexpr int kJobWorkers = 1024;

struct RoundResult {
  double p50_ms = 0;
  double p99_ms = 0;
  double heartbeats_per_s = 0;
  double schedule_1024_ms = -1;
  int64_t errors = 0;
};

double Median(std::vector<double> values) { return Quantile(std::move(values), 0.5); }

// One configuration on a fresh coordinator: registration, paced heartbeats, saturation and the
// 1,024-worker job. Prints the phases' JSON lines.
absl::StatusOr<RoundResult> RunRound(Security security, int round, const std::string& pki_dir) {
  const int workers = absl::GetFlag(FLAGS_workers);
  char state_template[] = "/tmp/zeroshard-coordinator-load-XXXXXX";
  const char* state_dir = mkdtemp(state_template);
  if (state_dir == nullptr) return absl::InternalError("mkdtemp failed");
  // Declared before the server, so removed after it stops, on every return.
  absl::Cleanup remove_state_dir = [state_dir] { std::filesystem::remove_all(state_dir); };
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = -1;
  options.state_dir = state_dir;
  security::ClientCredentials worker_credentials;
  security::ClientCredentials admin_credentials;
  if (security == Security::kTlsTokens) {
    ZS_ASSIGN_OR_RETURN(BenchCredentials credentials, MakeTlsAndTokens(pki_dir));
    options.tls = credentials.server_tls;
    options.token_file = credentials.token_file;
    worker_credentials = credentials.worker;
    admin_credentials = credentials.admin;
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<coordinator::CoordinatorServer> server,
                      coordinator::CoordinatorServer::Start(options));
  const absl::Duration period = options.manager.lease.heartbeat_period;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<LoadBench> bench,
                      LoadBench::Create(server->grpc_target(), worker_credentials,
                                        admin_credentials, absl::GetFlag(FLAGS_channels)));
  const char* name = SecurityName(security);
  RoundResult result;
  const absl::Time register_start = absl::Now();
  result.errors += bench->RegisterWorkers(workers);
  const absl::Duration register_time = absl::Now() - register_start;
  if (security == Security::kTlsTokens) {
    // A secured figure without enforcement would measure TLS alone: refuse to produce one.
    const absl::Status enforced =
        bench->CheckEnforcement(server->grpc_target(), worker_credentials);
    if (!enforced.ok()) {
      server->Shutdown();
      return enforced;
    }
    std::printf(
        "{\"bench\":\"coordinator_enforcement\",\"security\":\"%s\",\"round\":%d,"
        "\"no_secret\":\"PERMISSION_DENIED\",\"wrong_secret\":\"PERMISSION_DENIED\","
        "\"no_token\":\"UNAUTHENTICATED\"}\n",
        name, round);
  }

  CallLog periodic;
  bench->PeriodicHeartbeats(period, absl::Seconds(absl::GetFlag(FLAGS_duration_s)),
                            absl::GetFlag(FLAGS_client_threads), periodic);
  result.errors += periodic.errors();
  result.p50_ms = periodic.QuantileMs(0.5);
  result.p99_ms = periodic.QuantileMs(0.99);
  std::printf(
      "{\"bench\":\"coordinator_heartbeats\",\"security\":\"%s\",\"round\":%d,\"workers\":%d,"
      "\"period_ms\":%.0f,\"duration_s\":%d,\"heartbeats\":%lld,\"errors\":%lld,\"p50_ms\":%.3f,"
      "\"p99_ms\":%.3f,\"register_s\":%.3f}\n",
      name, round, workers, Ms(period), absl::GetFlag(FLAGS_duration_s),
      static_cast<long long>(periodic.count()), static_cast<long long>(periodic.errors()),
      result.p50_ms, result.p99_ms, absl::ToDoubleSeconds(register_time));
  std::fflush(stdout);

  int64_t saturation_errors = 0;
  result.heartbeats_per_s =
      bench->Saturate(absl::Seconds(absl::GetFlag(FLAGS_saturation_s)),
                      absl::GetFlag(FLAGS_saturation_in_flight), saturation_errors);
  result.errors += saturation_errors;
  std::printf(
      "{\"bench\":\"coordinator_saturation\",\"security\":\"%s\",\"round\":%d,\"workers\":%d,"
      "\"in_flight\":%d,\"duration_s\":%d,\"heartbeats_per_s\":%.0f,\"errors\":%lld}\n",
      name, round, workers, absl::GetFlag(FLAGS_saturation_in_flight),
      absl::GetFlag(FLAGS_saturation_s), result.heartbeats_per_s,
      static_cast<long long>(saturation_errors));
  std::fflush(stdout);

  double submit_ms = -1;
  absl::StatusOr<LoadBench::Scheduled> scheduled =
      bench->SubmitAndAwaitRunning("burst-1024", kJobWorkers);
  if (scheduled.ok()) {
    submit_ms = Ms(scheduled->submit_latency);
    result.schedule_1024_ms = Ms(scheduled->to_running);
  } else {
    ++result.errors;
    std::fprintf(stderr, "coordinator_load: %s\n", scheduled.status().ToString().c_str());
  }
  std::printf(
      "{\"bench\":\"coordinator_schedule\",\"security\":\"%s\",\"round\":%d,\"job_workers\":%d,"
      "\"idle_workers\":%d,\"submit_ms\":%.3f,\"schedule_1024_ms\":%.3f}\n",
      name, round, kJobWorkers, workers, submit_ms, result.schedule_1024_ms);
  std::fflush(stdout);
  bench.reset();
  server->Shutdown();
  return result;
}

int Run() {
  const int workers = absl::GetFlag(FLAGS_workers);
  if (workers < kJobWorkers) {
    std::fprintf(stderr, "coordinator_load: --workers must be at least %d\n", kJobWorkers);
    return 2;
  }
  absl::StatusOr<std::vector<Security>> configurations =
      ParseSecurityFlag(absl::GetFlag(FLAGS_security));
  if (!configurations.ok()) {
    std::fprintf(stderr, "coordinator_load: %s\n", configurations.status().ToString().c_str());
    return 2;
  }
  char pki_template[] = "/tmp/zeroshard-coordinator-load-pki-XXXXXX";
  const char* pki_dir = mkdtemp(pki_template);
  if (pki_dir == nullptr) {
    std::perror("coordinator_load: mkdtemp");
    return 1;
  }
  absl::Cleanup remove_pki_dir = [pki_dir] { std::filesystem::remove_all(pki_dir); };
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const size_t n = configurations->size();
  std::vector<std::vector<RoundResult>> results(n);
  int64_t errors = 0;
  for (int round = 0; round < rounds; ++round) {
    // Alternating the order spreads the machine's drift over both configurations.
    for (size_t k = 0; k < n; ++k) {
      const size_t c = round % 2 == 0 ? k : n - 1 - k;
      absl::StatusOr<RoundResult> result = RunRound((*configurations)[c], round, pki_dir);
      if (!result.ok()) {
        std::fprintf(stderr, "coordinator_load: %s\n", result.status().ToString().c_str());
        return 1;
      }
      errors += result->errors;
      results[c].push_back(*result);
    }
  }
  std::move(remove_pki_dir).Invoke();

  if (absl::GetFlag(FLAGS_planner)) {
    absl::StatusOr<std::string> planner = RunPlannerBench();
    if (planner.ok()) {
      std::printf("%s\n", planner->c_str());
    } else {
      ++errors;
      std::fprintf(stderr, "coordinator_load: %s\n", planner.status().ToString().c_str());
    }
  }
  // Per configuration: medians over the rounds.
  std::vector<RoundResult> medians(n);
  const double period_s =
      absl::ToDoubleSeconds(coordinator::CoordinatorServerOptions().manager.lease.heartbeat_period);
  for (size_t c = 0; c < n; ++c) {
    std::vector<double> p50, p99, rate, schedule;
    int64_t config_errors = 0;
    for (const RoundResult& r : results[c]) {
      p50.push_back(r.p50_ms);
      p99.push_back(r.p99_ms);
      rate.push_back(r.heartbeats_per_s);
      schedule.push_back(r.schedule_1024_ms);
      config_errors += r.errors;
    }
    medians[c] = {Median(p50), Median(p99), Median(rate), Median(schedule), config_errors};
    std::printf(
        "{\"bench\":\"coordinator_load\",\"security\":\"%s\",\"rounds\":%d,\"workers\":%d,"
        "\"heartbeats_per_s\":%.0f,\"periodic_heartbeats_per_s\":%.0f,\"p50_ms\":%.3f,"
        "\"p99_ms\":%.3f,\"errors\":%lld,\"schedule_1024_ms\":%.3f}\n",
        SecurityName((*configurations)[c]), rounds, workers, medians[c].heartbeats_per_s,
        workers / period_s, medians[c].p50_ms, medians[c].p99_ms,
        static_cast<long long>(config_errors), medians[c].schedule_1024_ms);
  }
  if (n == 2) {
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf(
        "{\"bench\":\"coordinator_load_tls_cost\",\"rounds\":%d,\"workers\":%d,"
        "\"p50_ratio\":%.2f,\"p99_ratio\":%.2f,\"heartbeats_per_s_ratio\":%.2f,"
        "\"schedule_1024_ratio\":%.2f}\n",
        rounds, workers, ratio(medians[1].p50_ms, medians[0].p50_ms),
        ratio(medians[1].p99_ms, medians[0].p99_ms),
        ratio(medians[1].heartbeats_per_s, medians[0].heartbeats_per_s),
        ratio(medians[1].schedule_1024_ms, medians[0].schedule_1024_ms));
  }
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As zeroshard-coordinator does: no lock-order cycle check on every Mutex acquisition.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return zeroshard::bench::Run();
}
