// Simulated coordinator clients for the benchmarks: see coordinator_load_lib.h.
#include "tests/bench/coordinator_load_lib.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "security/identity.h"
#include "security/metadata.h"
#include "security/test_certificates.h"

namespace zeroshard::bench {
namespace {

constexpr int kWorkersPerHost = 64;

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// One blocking Heartbeat as `worker_id`, with `secret` unless empty.
grpc::Status HeartbeatOnce(v1::Coordinator::Stub& stub, const std::string& worker_id,
                           const std::string& secret) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!secret.empty()) context.AddMetadata(security::kWorkerSecretKey, secret);
  v1::HeartbeatRequest request;
  request.set_worker_id(worker_id);
  v1::HeartbeatResponse response;
  return stub.Heartbeat(&context, request, &response);
}

absl::Status ExpectCode(const grpc::Status& status, grpc::StatusCode expected,
                        absl::string_view call) {
  if (status.error_code() == expected) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the coordinator does not enforce identities and roles: ", call, " gave code ",
                   static_cast<int>(status.error_code()), " (", status.error_message(),
                   "), expected ", static_cast<int>(expected)));
}

struct HeartbeatCall {
  grpc::ClientContext context;
  v1::HeartbeatRequest request;
  v1::HeartbeatResponse response;
  absl::Time start;
};

}  // namespace

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index =
      std::min(values.size() - 1, static_cast<size_t>(q * static_cast<double>(values.size())));
  return values[index];
}

const char* SecurityName(Security security) {
  return security == Security::kPlaintext ? "plaintext" : "tls_tokens";
}

absl::StatusOr<std::vector<Security>> ParseSecurityFlag(absl::string_view flag) {
  if (flag == "plaintext") return std::vector<Security>{Security::kPlaintext};
  if (flag == "tls_tokens") return std::vector<Security>{Security::kTlsTokens};
  if (flag == "both") return std::vector<Security>{Security::kPlaintext, Security::kTlsTokens};
  return absl::InvalidArgumentError(
      absl::StrCat("--security is plaintext, tls_tokens or both, not '", flag, "'"));
}

absl::StatusOr<BenchCredentials> MakeTlsAndTokens(const std::string& dir) {
  ZS_ASSIGN_OR_RETURN(security::TestCertificateAuthority ca,
                      security::TestCertificateAuthority::Create(dir, "zeroshard-bench-ca"));
  ZS_ASSIGN_OR_RETURN(security::CertificateFiles server, ca.Issue("zeroshard-bench-coordinator"));
  BenchCredentials made;
  made.server_tls.cert_file = server.cert;
  made.server_tls.key_file = server.key;
  const std::string& ca_cert = ca.ca_cert();
  made.worker.tls.ca_file = ca_cert;
  made.worker.token = security::RandomSecret();
  made.admin.tls.ca_file = ca_cert;
  made.admin.token = security::RandomSecret();
  made.token_file = absl::StrCat(dir, "/tokens");
  ZS_RETURN_IF_ERROR(
      WriteFile(made.token_file,
                absl::StrCat("# coordinator benchmark, made at run time\n", made.worker.token,
                             " worker bench-workers\n", made.admin.token, " admin bench-admin\n")));
  return made;
}

void CallLog::Record(bool ok, absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  if (ok) {
    latencies_ms_.push_back(Ms(latency));
  } else {
    ++errors_;
  }
}

int64_t CallLog::errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
}

int64_t CallLog::count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(latencies_ms_.size()) + errors_;
}

double CallLog::QuantileMs(double q) const {
  absl::MutexLock lock(&mu_);
  return Quantile(latencies_ms_, q);
}

void InFlight::Add() {
  absl::MutexLock lock(&mu_);
  ++count_;
}

void InFlight::Done() {
  absl::MutexLock lock(&mu_);
  --count_;
}

void InFlight::AwaitAtMost(int64_t limit) {
  absl::MutexLock lock(&mu_);
  limit_ = limit;
  mu_.Await(absl::Condition(this, &InFlight::AtMostLimit));
}

absl::StatusOr<std::unique_ptr<LoadBench>> LoadBench::Create(
    const std::string& target, const security::ClientCredentials& worker_credentials,
    const security::ClientCredentials& admin_credentials, int channels) {
  std::unique_ptr<LoadBench> bench(new LoadBench());
  for (int i = 0; i < std::max(1, channels); ++i) {
    grpc::ChannelArguments args;
    args.SetInt("zeroshard.bench_channel", i);  // one connection per channel
    ZS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                        security::CreateCoordinatorChannel(target, worker_credentials, args));
    bench->stubs_.push_back(v1::Coordinator::NewStub(channel));
  }
  grpc::ChannelArguments admin_args;
  admin_args.SetInt("zeroshard.bench_channel", -1);
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> admin_channel,
                      security::CreateCoordinatorChannel(target, admin_credentials, admin_args));
  bench->admin_stub_ = v1::Coordinator::NewStub(admin_channel);
  return bench;
}

int64_t LoadBench::IndexOf(const std::string& worker_id) const {
  const auto found = std::find(worker_ids_.begin(), worker_ids_.end(), worker_id);
  return found == worker_ids_.end() ? -1 : found - worker_ids_.begin();
}

void LoadBench::AddWorkerSecret(int64_t worker, grpc::ClientContext& context) const {
  std::string secret = secrets_[worker]->Get();
  if (!secret.empty()) context.AddMetadata(security::kWorkerSecretKey, std::move(secret));
}

int64_t LoadBench::RegisterWorkers(int n) {
  worker_ids_.assign(n, "");
  secrets_.clear();
  for (int i = 0; i < n; ++i) secrets_.push_back(std::make_shared<security::WorkerSecret>());
  struct Call {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    v1::RegisterWorkerResponse response;
  };
  std::atomic<int64_t> errors{0};
  InFlight& in_flight = in_flight_;
  for (int i = 0; i < n; ++i) {
    in_flight.AwaitAtMost(255);
    auto* call = new Call;
    call->request.set_name(absl::StrFormat("bench-%d", i));
    call->request.set_host(absl::StrFormat("host-%d", i / kWorkersPerHost));
    call->request.set_device_kind(v1::CPU);
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    in_flight.Add();
    StubFor(i).async()->RegisterWorker(&call->context, &call->request, &call->response,
                                       [this, call, i, &errors, &in_flight](grpc::Status s) {
                                         if (s.ok()) {
                                           worker_ids_[i] = call->response.worker_id();
                                           secrets_[i]->Set(call->response.worker_secret());
                                         } else {
                                           ++errors;
                                         }
                                         delete call;
                                         in_flight.Done();
                                       });
  }
  in_flight.AwaitAtMost(0);
  return errors.load();
}

absl::Status LoadBench::CheckEnforcement(const std::string& target,
                                         const security::ClientCredentials& worker_credentials) {
  if (workers() < 2) return absl::InvalidArgumentError("the check needs two registered workers");
  for (int64_t i = 0; i < workers(); ++i) {
    if (worker_ids_[i].empty() || secrets_[i]->Get().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the coordinator does not enforce identities and roles: worker ", i,
                       " has no worker_secret from RegisterWorker"));
    }
  }
  ZS_RETURN_IF_ERROR(ExpectCode(HeartbeatOnce(StubFor(0), worker_ids_[0], ""),
                                grpc::StatusCode::PERMISSION_DENIED,
                                "a Heartbeat without a secret"));
  ZS_RETURN_IF_ERROR(ExpectCode(HeartbeatOnce(StubFor(0), worker_ids_[0], secrets_[1]->Get()),
                                grpc::StatusCode::PERMISSION_DENIED,
                                "a Heartbeat with another worker's secret"));
  security::ClientCredentials no_token = worker_credentials;
  no_token.token.clear();
  grpc::ChannelArguments args;
  args.SetInt("zeroshard.bench_channel", -2);  // its own connection
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      security::CreateCoordinatorChannel(target, no_token, args));
  std::unique_ptr<Stub> tokenless = v1::Coordinator::NewStub(channel);
  ZS_RETURN_IF_ERROR(ExpectCode(HeartbeatOnce(*tokenless, worker_ids_[0], secrets_[0]->Get()),
                                grpc::StatusCode::UNAUTHENTICATED, "a Heartbeat without a token"));
  // And the credentials the load uses are accepted.
  return ExpectCode(HeartbeatOnce(StubFor(0), worker_ids_[0], secrets_[0]->Get()),
                    grpc::StatusCode::OK, "a Heartbeat with the worker token and its secret");
}

// Sends one Heartbeat with the async callback API; `done(ok, latency)` runs on a gRPC thread.
void LoadBench::SendHeartbeat(int64_t worker, std::function<void(bool, absl::Duration)> done) {
  auto* call = new HeartbeatCall;
  call->request.set_worker_id(worker_ids_[worker]);
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  AddWorkerSecret(worker, call->context);
  call->start = absl::Now();
  StubFor(worker).async()->Heartbeat(&call->context, &call->request, &call->response,
                                     [call, done = std::move(done)](grpc::Status status) {
                                       const absl::Duration latency = absl::Now() - call->start;
                                       delete call;
                                       done(status.ok(), latency);
                                     });
}

void LoadBench::PeriodicHeartbeats(absl::Duration period, absl::Duration duration, int threads,
                                   CallLog& log) {
  threads = std::max(1, threads);
  const int64_t n = workers();
  const absl::Time begin = absl::Now();
  const absl::Time end = begin + duration;
  InFlight& in_flight = in_flight_;
  std::vector<std::thread> pacers;
  for (int t = 0; t < threads; ++t) {
    pacers.emplace_back([&, t] {
      // Worker i beats at begin + (i / n + k) * period, k = 0, 1, ...
      for (int64_t beat = t;; beat += threads) {
        const int64_t worker = beat % n;
        const absl::Time due = begin + period * (static_cast<double>(beat) / n);
        if (due >= end) break;
        const absl::Time now = absl::Now();
        if (due > now) absl::SleepFor(due - now);
        in_flight.Add();
        SendHeartbeat(worker, [&log, &in_flight](bool ok, absl::Duration latency) {
          log.Record(ok, latency);
          in_flight.Done();
        });
      }
    });
  }
  for (std::thread& pacer : pacers) pacer.join();
  in_flight.AwaitAtMost(0);
}

double LoadBench::Saturate(absl::Duration duration, int window, int64_t& errors) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> next_worker{0};
  InFlight& in_flight = in_flight_;
  std::function<void()> issue = [&] {
    const int64_t worker = next_worker.fetch_add(1) % workers();
    in_flight.Add();
    SendHeartbeat(worker, [&](bool ok, absl::Duration) {
      if (!stop.load()) {
        ++(ok ? completed : failed);
        issue();
      }
      in_flight.Done();
    });
  };
  const absl::Time begin = absl::Now();
  for (int i = 0; i < window; ++i) issue();
  absl::SleepFor(duration);
  stop.store(true);
  const int64_t done = completed.load();
  const absl::Duration elapsed = absl::Now() - begin;
  in_flight.AwaitAtMost(0);
  errors += failed.load();
  return static_cast<double>(done) / absl::ToDoubleSeconds(elapsed);
}

absl::StatusOr<LoadBench::Scheduled> LoadBench::SubmitAndAwaitRunning(const std::string& name,
                                                                      int job_workers) {
  v1::SubmitJobRequest request;
  v1::JobSpec& spec = *request.mutable_spec();
  spec.set_name(name);
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_min_workers(job_workers);
  spec.set_max_workers(job_workers);
  spec.set_global_batch(job_workers);
  Scheduled scheduled;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  const absl::Time start = absl::Now();
  const grpc::Status submitted = AdminStub().SubmitJob(&context, request, &scheduled.job);
  scheduled.submit_latency = absl::Now() - start;
  if (!submitted.ok()) return absl::InternalError("SubmitJob: " + submitted.error_message());
  // The manager schedules inside SubmitJob, so the first GetJob normally says RUNNING already;
  // it is still part of the measured time.
  const absl::Time deadline = start + absl::Seconds(30);
  do {
    if (absl::Now() > deadline) return absl::DeadlineExceededError("job never ran");
    v1::GetJobRequest get;
    get.set_job_id(scheduled.job.id());
    grpc::ClientContext get_context;
    get_context.set_deadline(absl::ToChronoTime(deadline));
    const grpc::Status status = AdminStub().GetJob(&get_context, get, &scheduled.job);
    if (!status.ok()) return absl::InternalError("GetJob: " + status.error_message());
  } while (scheduled.job.state() != v1::RUNNING);
  scheduled.to_running = absl::Now() - start;
  if (scheduled.job.worker_ids_size() != job_workers) {
    return absl::InternalError(
        absl::StrFormat("job runs on %d workers", scheduled.job.worker_ids_size()));
  }
  return scheduled;
}

}  // namespace zeroshard::bench
