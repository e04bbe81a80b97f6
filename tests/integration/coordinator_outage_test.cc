// Issue 12, item 5, on real processes: a W = 2 job outlives three kill -9s of the coordinator in
// one (adopted) generation, with the losses, bit for bit, of the same job run without restarts;
// with TLS and tokens (issue 23) and in plaintext; and (issue 38, row 6) a zero3 job outlives one
// with TLS and tokens.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_credentials.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

// Short heartbeats, so that workers notice an outage and a restart within a fraction of a second.
constexpr absl::Duration kHeartbeatPeriod = absl::Milliseconds(200);
constexpr int kMissedHeartbeats = 3;
// Generous for a loaded 2-core machine (a restart and the workers' reconnects can take seconds
// there); operators get 2 leases by default.
constexpr char kAdoptionWindowFlag[] = "--adoption_window=30s";
// The job with restarts is sized, from a calibration job, to train about 20 s per kill: long
// enough for its kill, restart and adoption rounds of about 5 s each, even when the machine turns
// out twice as fast as the calibration said.
constexpr int64_t kCalibrationSteps = 1000;
constexpr absl::Duration kTrainingTimePerKill = absl::Seconds(20);
// Reports that reach each restarted coordinator before the next kill.
constexpr int64_t kStepsBetweenKills = 50;
constexpr absl::Duration kStateDeadline = absl::Seconds(60);
constexpr absl::Duration kJobDeadline = absl::Seconds(600);

// A small MLP whose steps (a few ms) keep rank 0's reports within what the coordinator's durable
// writes sustain.
v1::JobSpec OutageSpec(const std::string& name, int64_t steps, v1::Mode mode) {
  v1::JobSpec spec;
  spec.set_name(name);
  for (int64_t width : {32, 256, 256, 32}) spec.mutable_workload()->add_layer_sizes(width);
  spec.mutable_workload()->set_dataset_size(1024);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(0.001);
  spec.set_mode(mode);
  spec.set_min_workers(2);
  spec.set_max_workers(2);
  spec.set_global_batch(128);
  spec.set_steps(steps);
  spec.set_seed(0);
  return spec;
}

absl::StatusOr<v1::Job> RunToTheEnd(LocalCluster& cluster, const v1::JobSpec& spec) {
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  if (!submitted.ok()) return submitted.status();
  return cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); },
      kJobDeadline, "ended");
}

// Follows a job's events from its start to its end on a thread of its own, through coordinator
// restarts: it reconnects after the last event it got. (Replaying a long history at once would
// overflow the stream's backlog; following it live never does.)
//
// Thread contract: construct, Events() and destroy on the test's thread; only the collector's
// thread touches the events until Events() has joined it. The destructor cancels the stream.
class EventCollector {
 public:
  EventCollector(v1::Coordinator::Stub* stub, std::string job_id)
      : stub_(stub), job_id_(std::move(job_id)), thread_([this] { Follow(); }) {}
  ~EventCollector() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  // Waits until the job ended (or following it failed) and returns its whole history.
  absl::StatusOr<std::vector<v1::JobEvent>> Events() {
    thread_.join();
    if (!status_.ok()) return status_;
    return events_;
  }

 private:
  void Follow() {
    const absl::Time deadline = absl::Now() + kJobDeadline;
    while (true) {
      grpc::ClientContext context;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
        context_ = &context;
      }
      v1::WatchJobRequest request;
      request.set_job_id(job_id_);
      request.set_after_sequence(events_.empty() ? 0 : events_.back().sequence());
      std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
      for (v1::JobEvent event; reader->Read(&event);) events_.push_back(event);
      const grpc::Status finished = reader->Finish();
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (finished.ok()) return;
      if (absl::Now() >= deadline) {
        status_ = absl::DeadlineExceededError(
            absl::StrCat("following ", job_id_, ": ", finished.error_message()));
        return;
      }
      // The coordinator is down or restarting: reconnect shortly.
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(20))) break;
    }
    status_ = absl::CancelledError(absl::StrCat("following ", job_id_, ": stopped"));
  }

  v1::Coordinator::Stub* const stub_;
  const std::string job_id_;
  std::vector<v1::JobEvent> events_;
  absl::Status status_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The stream being read, so that the destructor can cancel it.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // last: starts after the members above exist
};

// Lines of `path` that contain `needle`.
int CountLines(const std::string& path, absl::string_view needle) {
  std::ifstream in(path);
  int count = 0;
  for (std::string line; std::getline(in, line);) count += absl::StrContains(line, needle);
  return count;
}

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

enum class Security { kPlaintext, kTlsTokens };

struct OutageCase {
  std::string name;
  Security security = Security::kTlsTokens;
  v1::Mode mode = v1::ZERO2;
  int coordinator_kills = 3;
};

// Run as clusters run (TLS, a token file, workers on the worker role; before issue 23 that case
// failed: the restarted coordinator refused every heartbeat forever) and in plaintext, in zero2.
// zero3 (issue 38, row 6) with TLS and tokens, and one kill to keep the suite short: adoption
// does not depend on the mode, the kill and the training after it in zero3 are what is checked.
// The zero3 case fails before the fix: mode ZERO3 was refused at submission.
class CoordinatorOutageTest : public ::testing::TestWithParam<OutageCase> {};

INSTANTIATE_TEST_SUITE_P(
    Cases, CoordinatorOutageTest,
    ::testing::Values(OutageCase{"TlsTokens", Security::kTlsTokens, v1::ZERO2, 3},
                      OutageCase{"Plaintext", Security::kPlaintext, v1::ZERO2, 3},
                      OutageCase{"TlsTokensZero3", Security::kTlsTokens, v1::ZERO3, 1}),
    [](const ::testing::TestParamInfo<OutageCase>& info) { return info.param.name; });

TEST_P(CoordinatorOutageTest, KillNinesOfTheCoordinatorEndNoGeneration) {
  const OutageCase& outage = GetParam();
  LocalClusterOptions options;
  options.heartbeat_period = kHeartbeatPeriod;
  options.missed_heartbeats = kMissedHeartbeats;
  options.extra_coordinator_flags = {kAdoptionWindowFlag};
  if (outage.security == Security::kTlsTokens) {
    absl::StatusOr<ClusterCredentials> credentials =
        MakeClusterCredentials(absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki"));
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    options.security = credentials->security;
  }
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.Start(2);
  ASSERT_TRUE(started.ok()) << started;

  // How fast this machine trains the job now.
  const absl::Time calibration_start = absl::Now();
  absl::StatusOr<v1::Job> calibration =
      RunToTheEnd(cluster, OutageSpec("calibration", kCalibrationSteps, outage.mode));
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  ASSERT_EQ(calibration->state(), v1::SUCCEEDED) << calibration->message();
  const absl::Duration per_step = (absl::Now() - calibration_start) / kCalibrationSteps;
  const int64_t steps =
      std::clamp<int64_t>(outage.coordinator_kills * kTrainingTimePerKill / per_step, 3000, 200000);
  std::cout << "calibration: " << per_step << " per step; the job runs " << steps << " steps\n";

  absl::StatusOr<v1::Job> submitted =
      cluster.client().SubmitJob(OutageSpec("outage", steps, outage.mode));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job_id = submitted->id();
  EventCollector history(cluster.client().stub(), job_id);
  int64_t seen_step = 0;
  for (int kill = 1; kill <= outage.coordinator_kills; ++kill) {
    SCOPED_TRACE(absl::StrCat("kill ", kill));
    // Rank 0's reports reach this coordinator (after an adoption: they resumed).
    absl::StatusOr<v1::Job> running = cluster.WaitForJob(
        job_id,
        [&](const v1::Job& job) {
          return IsFinalJobState(job.state()) ||
                 job.progress().step() >= seen_step + kStepsBetweenKills;
        },
        kStateDeadline, "reports arriving");
    ASSERT_TRUE(running.ok()) << running.status();
    // Far from its end, so that it still trains when the coordinator is back.
    ASSERT_TRUE(running->state() == v1::RUNNING && running->progress().step() < steps * 3 / 4)
        << "the job is at step " << running->progress().step() << " of " << steps << " ("
        << v1::JobState_Name(running->state()) << ") before kill " << kill
        << "; the machine trained faster than the calibration said";
    const std::set<std::string> ranks(running->worker_ids().begin(), running->worker_ids().end());

    const auto unreachable = [&] {
      int lines = 0;
      for (int i = 0; i < 2; ++i) {
        lines += CountLines(cluster.worker_process(i).log_path, "the coordinator is unreachable");
      }
      return lines;
    };
    const int unreachable_before = unreachable();
    absl::Status killed = cluster.StopCoordinator(SIGKILL);
    ASSERT_TRUE(killed.ok()) << killed;
    // Rank 0 trains on: its next step's report finds the coordinator gone.
    absl::Status noticed = cluster.WaitFor([&] { return unreachable() > unreachable_before; },
                                           kStateDeadline, "rank 0's reports failing");
    ASSERT_TRUE(noticed.ok()) << noticed;

    absl::Status restarted = cluster.StartCoordinator();
    ASSERT_TRUE(restarted.ok()) << restarted;
    // The new coordinator started knowing no worker: once it lists the generation's two workers
    // BUSY under their old ids, both re-registered and the generation was adopted.
    absl::Status adopted = cluster.WaitForBusyWorkerIds(ranks, kStateDeadline);
    ASSERT_TRUE(adopted.ok()) << adopted;
    absl::StatusOr<v1::Job> after = cluster.client().GetJob(job_id);
    ASSERT_TRUE(after.ok()) << after.status();
    ASSERT_EQ(after->state(), v1::RUNNING) << after->message();
    EXPECT_EQ(after->message(), "generation 1 adopted after a coordinator restart");
    EXPECT_EQ(after->generation(), 1);
    seen_step = after->progress().step();
  }

  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      job_id, [](const v1::Job& job) { return IsFinalJobState(job.state()); }, kJobDeadline,
      "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_EQ(ended->generation(), 1);
  EXPECT_EQ(ended->attempts(), 1);
  EXPECT_EQ(ended->progress().step(), steps);

  absl::StatusOr<std::vector<v1::JobEvent>> events = history.Events();
  ASSERT_TRUE(events.ok()) << events.status();
  int generations_started = 0;
  int adoptions_begun = 0;
  std::vector<v1::JobState> states;
  std::vector<v1::StepMetrics> progress;
  for (const v1::JobEvent& event : *events) {
    switch (event.type()) {
      case v1::GENERATION_STARTED:
        ++generations_started;
        break;
      case v1::NOTICE:
        adoptions_begun += absl::StrContains(event.message(), "adopting generation 1");
        break;
      case v1::STATE_CHANGED:
        states.push_back(event.state());
        break;
      case v1::PROGRESS:
        progress.push_back(event.progress());
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(generations_started, 1);
  EXPECT_EQ(adoptions_begun, outage.coordinator_kills);
  // RUNNING again after each adoption.
  std::vector<v1::JobState> expected_states = {v1::PENDING, v1::RUNNING};
  expected_states.insert(expected_states.end(), outage.coordinator_kills, v1::RUNNING);
  expected_states.push_back(v1::SUCCEEDED);
  EXPECT_EQ(states, expected_states);
  // The engine ran the mode asked for: only zero3 has a gather pool.
  EXPECT_EQ(ended->progress().memory().gather_pool_bytes() > 0, outage.mode == v1::ZERO3)
      << ended->progress().memory().ShortDebugString();
  ASSERT_FALSE(progress.empty());
  for (size_t i = 1; i < progress.size(); ++i) {
    ASSERT_GT(progress[i].step(), progress[i - 1].step()) << "PROGRESS event " << i;
  }
  EXPECT_EQ(progress.back().step(), steps);
  std::cout << "outage job: " << progress.size() << " of " << steps << " steps reported\n";

  // Training never stopped: the same job without restarts has the same loss at every step that
  // both reported, and at the last.
  absl::StatusOr<v1::Job> reference_submitted =
      cluster.client().SubmitJob(OutageSpec("reference", steps, outage.mode));
  ASSERT_TRUE(reference_submitted.ok()) << reference_submitted.status();
  EventCollector reference_history(cluster.client().stub(), reference_submitted->id());
  absl::StatusOr<v1::Job> reference = cluster.WaitForJob(
      reference_submitted->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); },
      kJobDeadline, "ended");
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->state(), v1::SUCCEEDED) << reference->message();
  EXPECT_EQ(Bits(ended->progress().loss()), Bits(reference->progress().loss()))
      << ended->progress().loss() << " with restarts, " << reference->progress().loss()
      << " without";
  absl::StatusOr<std::vector<v1::JobEvent>> reference_events = reference_history.Events();
  ASSERT_TRUE(reference_events.ok()) << reference_events.status();
  std::map<int64_t, double> reference_loss;
  for (const v1::JobEvent& event : *reference_events) {
    if (event.type() == v1::PROGRESS)
      reference_loss[event.progress().step()] = event.progress().loss();
  }
  int compared = 0;
  for (const v1::StepMetrics& metrics : progress) {
    const auto it = reference_loss.find(metrics.step());
    if (it == reference_loss.end()) continue;
    ++compared;
    ASSERT_EQ(Bits(metrics.loss()), Bits(it->second))
        << "step " << metrics.step() << ": " << metrics.loss() << " vs " << it->second;
  }
  EXPECT_GT(compared, 0);
  std::cout << "losses compared bitwise at " << compared << " steps\n";

  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace zeroshard::testing
