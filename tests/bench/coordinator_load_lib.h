// Simulated workers for the coordinator benchmarks (coordinator_load, hostile_load): channels
// with or without TLS and tokens, registration, paced and saturating heartbeats, and the
// throwaway certificates and token file a secured run needs.
#ifndef ZEROSHARD_TESTS_BENCH_COORDINATOR_LOAD_LIB_H_
#define ZEROSHARD_TESTS_BENCH_COORDINATOR_LOAD_LIB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "security/coordinator_channel.h"
#include "security/tls_files.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::bench {

double Ms(absl::Duration d);
// The q-quantile (0..1) of `values` by rank (no interpolation); 0 when empty.
double Quantile(std::vector<double> values, double q);

enum class Security { kPlaintext, kTlsTokens };
const char* SecurityName(Security security);
// "plaintext", "tls_tokens" or "both" (plaintext, then tls_tokens).
absl::StatusOr<std::vector<Security>> ParseSecurityFlag(absl::string_view flag);

// What a secured run gives the coordinator and its clients.
struct BenchCredentials {
  security::ServerTlsOptions server_tls;
  std::string token_file;
  // The CA and the worker token: what a worker daemon has.
  security::ClientCredentials worker;
  // The CA and an admin token: for submitting and watching the benchmark's jobs.
  security::ClientCredentials admin;
};

// Under `dir` (which must exist), with the openssl tool: a CA, a server certificate for
// 127.0.0.1 and localhost, and a token file with one worker token and one admin token.
absl::StatusOr<BenchCredentials> MakeTlsAndTokens(const std::string& dir);

// Latencies and errors of completed calls. Thread-safe.
class CallLog {
 public:
  void Record(bool ok, absl::Duration latency) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t errors() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t count() const ABSL_LOCKS_EXCLUDED(mu_);
  // The q-quantile of the successful calls' latencies, ms.
  double QuantileMs(double q) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counts calls in flight so a phase can wait for its stragglers. Thread-safe; outlives every
// call it counts.
class InFlight {
 public:
  void Add() ABSL_LOCKS_EXCLUDED(mu_);
  void Done() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until at most `limit` calls are in flight.
  void AwaitAtMost(int64_t limit) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool AtMostLimit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ <= limit_; }

  absl::Mutex mu_;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
};

// N simulated workers multiplexed over a few worker channels (worker credentials), plus one
// admin channel. Each worker keeps the secret its registration returned and sends it on every
// later call, as a daemon's channel does; the secret goes on the call's context because one
// connection carries many workers here (a daemon has one WorkerSecret per channel).
// Thread contract: RegisterWorkers, then the other methods, from one thread at a time; the
// calls' callbacks run on gRPC threads.
class LoadBench {
 public:
  using Stub = v1::Coordinator::Stub;

  static absl::StatusOr<std::unique_ptr<LoadBench>> Create(
      const std::string& target, const security::ClientCredentials& worker_credentials,
      const security::ClientCredentials& admin_credentials, int channels);

  Stub& StubFor(int64_t worker) { return *stubs_[worker % stubs_.size()]; }
  Stub& AdminStub() { return *admin_stub_; }
  int64_t workers() const { return static_cast<int64_t>(worker_ids_.size()); }
  // Index of the worker registered as `worker_id`, or -1.
  int64_t IndexOf(const std::string& worker_id) const;
  // Puts worker `worker`'s secret, once it has one, into `context`'s metadata.
  void AddWorkerSecret(int64_t worker, grpc::ClientContext& context) const;

  // Registers `n` workers (64 per host name), at most 256 registrations in flight. Returns the
  // failed registrations.
  int64_t RegisterWorkers(int n);

  // Proves, after RegisterWorkers against a coordinator with TLS and a token file, that it
  // enforces identities and roles, so that a secured run measures the checks: every worker got
  // a secret, a Heartbeat without its secret or with another worker's is PERMISSION_DENIED, and
  // one on `target` without a token (TLS only) is UNAUTHENTICATED. Three calls.
  absl::Status CheckEnforcement(const std::string& target,
                                const security::ClientCredentials& worker_credentials);

  // Every worker beats once per `period` (spread evenly over the period) for `duration`, paced
  // by `threads` threads.
  void PeriodicHeartbeats(absl::Duration period, absl::Duration duration, int threads,
                          CallLog& log);

  // Heartbeats with `window` always outstanding, round-robin over the workers, for `duration`.
  // Returns the completions per second; failed calls are added to `errors`.
  double Saturate(absl::Duration duration, int window, int64_t& errors);

  // Submits (admin channel) a CPU job of exactly `job_workers` workers and polls GetJob until it
  // is RUNNING. Returns it with SubmitJob's latency and the time from submission to RUNNING.
  struct Scheduled {
    v1::Job job;
    absl::Duration submit_latency;
    absl::Duration to_running;
  };
  absl::StatusOr<Scheduled> SubmitAndAwaitRunning(const std::string& name, int job_workers);

 private:
  LoadBench() = default;
  void SendHeartbeat(int64_t worker, std::function<void(bool, absl::Duration)> done);

  std::vector<std::unique_ptr<Stub>> stubs_;
  std::unique_ptr<Stub> admin_stub_;
  std::vector<std::string> worker_ids_;
  std::vector<std::shared_ptr<security::WorkerSecret>> secrets_;
  InFlight in_flight_;
};

}  // namespace zeroshard::bench

#endif  // ZEROSHARD_TESTS_BENCH_COORDINATOR_LOAD_LIB_H_
