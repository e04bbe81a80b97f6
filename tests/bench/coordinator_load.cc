// Coordinator load benchmark: an in-process coordinator (real clock, real gRPC on loopback) and
// N simulated workers, each sending its own unary Heartbeat at the coordinator's period; then
// heartbeats as fast as the clients can send (saturation); then a 1,024-worker job's scheduling
// time. Prints one JSON object per line, the summary ("bench":"coordinator_load") last.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_server.h"
#include "grpcpp/create_channel.h"
#include "tests/bench/planner_bench_lib.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

ABSL_FLAG(int, workers, 5000, "Simulated workers, each heartbeating on its own.");
ABSL_FLAG(int, duration_s, 10, "Seconds of heartbeats at the coordinator's period.");
ABSL_FLAG(int, saturation_s, 3, "Seconds of heartbeats as fast as the clients can send.");
ABSL_FLAG(int, channels, 8, "Client channels (connections) the workers are spread over.");
ABSL_FLAG(int, client_threads, 2, "Threads pacing the periodic heartbeats.");
ABSL_FLAG(int, saturation_in_flight, 512, "Heartbeats outstanding during saturation.");
ABSL_FLAG(bool, planner, true, "Also run the planner benchmark and print its line.");

namespace zeroshard::bench {
namespace {

using Stub = v1::Coordinator::Stub;

constexpr int kJobWorkers = 1024;
constexpr int kWorkersPerHost = 64;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Latencies and errors of completed calls; thread-safe.
class CallLog {
 public:
  void Record(bool ok, absl::Duration latency) {
    absl::MutexLock lock(&mu_);
    if (ok) {
      latencies_ms_.push_back(Ms(latency));
    } else {
      ++errors_;
    }
  }
  int64_t errors() const {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  int64_t count() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(latencies_ms_.size()) + errors_;
  }
  // The q-quantile (0..1) of the successful calls' latencies, ms.
  double Quantile(double q) {
    absl::MutexLock lock(&mu_);
    if (latencies_ms_.empty()) return 0;
    std::sort(latencies_ms_.begin(), latencies_ms_.end());
    const size_t index =
        std::min(latencies_ms_.size() - 1,
                 static_cast<size_t>(q * static_cast<double>(latencies_ms_.size())));
    return latencies_ms_[index];
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counts calls in flight so a phase can wait for its stragglers. Outlives every call.
class InFlight {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  // Blocks until at most `limit` calls are in flight.
  void AwaitAtMost(int64_t limit) {
    absl::MutexLock lock(&mu_);
    limit_ = limit;
    mu_.Await(absl::Condition(this, &InFlight::AtMostLimit));
  }

 private:
  bool AtMostLimit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ <= limit_; }

  absl::Mutex mu_;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
};

struct HeartbeatCall {
  grpc::ClientContext context;
  v1::HeartbeatRequest request;
  v1::HeartbeatResponse response;
  absl::Time start;
};

// Sends one Heartbeat with the async callback API; `done(ok, latency)` runs on a gRPC thread.
void SendHeartbeat(Stub& stub, const std::string& worker_id,
                   std::function<void(bool, absl::Duration)> done) {
  auto* call = new HeartbeatCall;
  call->request.set_worker_id(worker_id);
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  call->start = absl::Now();
  stub.async()->Heartbeat(&call->context, &call->request, &call->response,
                          [call, done = std::move(done)](grpc::Status status) {
                            const absl::Duration latency = absl::Now() - call->start;
                            delete call;
                            done(status.ok(), latency);
                          });
}

class LoadBench {
 public:
  explicit LoadBench(std::string target) {
    const int channels = std::max(1, absl::GetFlag(FLAGS_channels));
    for (int i = 0; i < channels; ++i) {
      grpc::ChannelArguments args;
      args.SetInt("zeroshard.bench_channel", i);  // one connection per channel
      stubs_.push_back(v1::Coordinator::NewStub(
          grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
    }
  }

  Stub& StubFor(int64_t worker) { return *stubs_[worker % stubs_.size()]; }

  // Registers `n` workers, at most 256 registrations in flight. Returns the errors.
  int64_t RegisterWorkers(int n) {
    worker_ids_.assign(n, "");
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

  // Every worker beats once per `period` (spread evenly over the period) for `duration`.
  void PeriodicHeartbeats(absl::Duration period, absl::Duration duration, CallLog& log) {
    const int threads = std::max(1, absl::GetFlag(FLAGS_client_threads));
    const int64_t n = static_cast<int64_t>(worker_ids_.size());
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
          SendHeartbeat(StubFor(worker), worker_ids_[worker],
                        [&log, &in_flight](bool ok, absl::Duration latency) {
                          log.Record(ok, latency);
                          in_flight.Done();
                        });
        }
      });
    }
    for (std::thread& pacer : pacers) pacer.join();
    in_flight.AwaitAtMost(0);
  }

  // Heartbeats with `window` always outstanding, round-robin over the workers, for `duration`.
  // Returns the completions per second within the window of time; errors go to `errors`.
  double Saturate(absl::Duration duration, int window, int64_t& errors) {
    std::atomic<bool> stop{false};
    std::atomic<int64_t> completed{0};
    std::atomic<int64_t> failed{0};
    std::atomic<int64_t> next_worker{0};
    InFlight& in_flight = in_flight_;
    std::function<void()> issue = [&] {
      const int64_t worker = next_worker.fetch_add(1) % static_cast<int64_t>(worker_ids_.size());
      in_flight.Add();
      SendHeartbeat(StubFor(worker), worker_ids_[worker], [&](bool ok, absl::Duration) {
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

  // Submits a job needing kJobWorkers workers and polls GetJob until it is RUNNING. Returns
  // {SubmitJob's latency, submission start to RUNNING}, or an error.
  absl::StatusOr<std::pair<absl::Duration, absl::Duration>> ScheduleBigJob() {
    v1::SubmitJobRequest request;
    v1::JobSpec& spec = *request.mutable_spec();
    spec.set_name("burst-1024");
    spec.mutable_workload()->set_preset("seed");
    spec.mutable_optimizer()->set_kind(v1::ADAMW);
    spec.set_min_workers(kJobWorkers);
    spec.set_max_workers(kJobWorkers);
    spec.set_global_batch(kJobWorkers);
    v1::Job job;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    const absl::Time start = absl::Now();
    const grpc::Status submitted = StubFor(0).SubmitJob(&context, request, &job);
    const absl::Duration submit_latency = absl::Now() - start;
    if (!submitted.ok()) return absl::InternalError("SubmitJob: " + submitted.error_message());
    // The manager schedules inside SubmitJob, so the first GetJob normally says RUNNING already;
    // it is still part of the measured time.
    const absl::Time deadline = start + absl::Seconds(30);
    do {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("job never ran");
      v1::GetJobRequest get;
      get.set_job_id(job.id());
      grpc::ClientContext get_context;
      get_context.set_deadline(absl::ToChronoTime(deadline));
      const grpc::Status status = StubFor(0).GetJob(&get_context, get, &job);
      if (!status.ok()) return absl::InternalError("GetJob: " + status.error_message());
    } while (job.state() != v1::RUNNING);
    if (job.worker_ids_size() != kJobWorkers) {
      return absl::InternalError(absl::StrFormat("job runs on %d workers", job.worker_ids_size()));
    }
    return std::make_pair(submit_latency, absl::Now() - start);
  }

 private:
  std::vector<std::unique_ptr<Stub>> stubs_;
  std::vector<std::string> worker_ids_;
  InFlight in_flight_;
};

int Run() {
  const int workers = absl::GetFlag(FLAGS_workers);
  if (workers < kJobWorkers) {
    std::fprintf(stderr, "coordinator_load: --workers must be at least %d\n", kJobWorkers);
    return 2;
  }
  char state_template[] = "/tmp/zeroshard-coordinator-load-XXXXXX";
  const char* state_dir = mkdtemp(state_template);
  if (state_dir == nullptr) {
    std::perror("coordinator_load: mkdtemp");
    return 1;
  }
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = -1;
  options.state_dir = state_dir;
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
      coordinator::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "coordinator_load: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const absl::Duration period = options.manager.lease.heartbeat_period;

  LoadBench bench((*server)->grpc_target());
  int64_t errors = 0;
  const absl::Time register_start = absl::Now();
  errors += bench.RegisterWorkers(workers);
  const absl::Duration register_time = absl::Now() - register_start;

  CallLog periodic;
  bench.PeriodicHeartbeats(period, absl::Seconds(absl::GetFlag(FLAGS_duration_s)), periodic);
  errors += periodic.errors();
  const double p50 = periodic.Quantile(0.5);
  const double p99 = periodic.Quantile(0.99);
  std::printf(
      "{\"bench\":\"coordinator_heartbeats\",\"workers\":%d,\"period_ms\":%.0f,"
      "\"duration_s\":%d,\"heartbeats\":%lld,\"errors\":%lld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
      "\"register_s\":%.3f}\n",
      workers, Ms(period), absl::GetFlag(FLAGS_duration_s),
      static_cast<long long>(periodic.count()), static_cast<long long>(periodic.errors()), p50, p99,
      absl::ToDoubleSeconds(register_time));
  std::fflush(stdout);

  int64_t saturation_errors = 0;
  const double per_second =
      bench.Saturate(absl::Seconds(absl::GetFlag(FLAGS_saturation_s)),
                     absl::GetFlag(FLAGS_saturation_in_flight), saturation_errors);
  errors += saturation_errors;
  std::printf(
      "{\"bench\":\"coordinator_saturation\",\"workers\":%d,\"in_flight\":%d,\"duration_s\":%d,"
      "\"heartbeats_per_s\":%.0f,\"errors\":%lld}\n",
      workers, absl::GetFlag(FLAGS_saturation_in_flight), absl::GetFlag(FLAGS_saturation_s),
      per_second, static_cast<long long>(saturation_errors));
  std::fflush(stdout);

  double submit_ms = -1;
  double schedule_ms = -1;
  absl::StatusOr<std::pair<absl::Duration, absl::Duration>> scheduled = bench.ScheduleBigJob();
  if (scheduled.ok()) {
    submit_ms = Ms(scheduled->first);
    schedule_ms = Ms(scheduled->second);
  } else {
    ++errors;
    std::fprintf(stderr, "coordinator_load: %s\n", scheduled.status().ToString().c_str());
  }
  std::printf(
      "{\"bench\":\"coordinator_schedule\",\"job_workers\":%d,\"idle_workers\":%d,"
      "\"submit_ms\":%.3f,\"schedule_1024_ms\":%.3f}\n",
      kJobWorkers, workers, submit_ms, schedule_ms);
  std::fflush(stdout);
  (*server)->Shutdown();
  std::filesystem::remove_all(state_dir);

  if (absl::GetFlag(FLAGS_planner)) {
    absl::StatusOr<std::string> planner = RunPlannerBench();
    if (planner.ok()) {
      std::printf("%s\n", planner->c_str());
    } else {
      ++errors;
      std::fprintf(stderr, "coordinator_load: %s\n", planner.status().ToString().c_str());
    }
  }
  std::printf(
      "{\"bench\":\"coordinator_load\",\"workers\":%d,\"heartbeats_per_s\":%.0f,"
      "\"periodic_heartbeats_per_s\":%.0f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"errors\":%lld,"
      "\"schedule_1024_ms\":%.3f}\n",
      workers, per_second, workers / absl::ToDoubleSeconds(period), p50, p99,
      static_cast<long long>(errors), schedule_ms);
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
