// The daemon's control loop against a real in-process coordinator over gRPC, with a fake
// training run: registration retries, convergence to RUN / ABORT / IDLE, re-registration, and a
// run that outlives a coordinator restart (adopted) or is aborted (not adopted), news (a run
// that ended) reported at once rather than at the next heartbeat period, and the peers a failed
// run saw die reported with it. And its credentials: the secret of each registration on every
// later call, and a registration refused for its credentials ends the daemon.
#include "worker/daemon/worker_daemon.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/free_port.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "security/coordinator_channel.h"
#include "security/metadata.h"

namespace zeroshard::worker {
namespace {

// Counts its life; "trains" until aborted, or until `failed` is notified (then it has failed,
// having seen `lost_when_failed` die). Counts the daemon's reads of its step too: every heartbeat
// and registration attempt reads it once. Thread-safe (atomics and constants), as TrainingRun
// says.
class FakeRun : public TrainingRun {
 public:
  FakeRun(std::atomic<int>* aborted, std::atomic<int>* step_reads, const absl::Notification* failed,
          std::vector<int32_t> lost_when_failed = {})
      : aborted_(aborted),
        step_reads_(step_reads),
        failed_(failed),
        lost_when_failed_(std::move(lost_when_failed)) {}
  void Abort() override {
    done_ = true;
    aborted_->fetch_add(1);
  }
  bool Done() const override { return done_ || failed_->HasBeenNotified(); }
  absl::Status status() const override {
    return !done_ && failed_->HasBeenNotified() ? absl::InternalError("the fake run failed")
                                                : absl::OkStatus();
  }
  int64_t step() const override { return step_reads_->fetch_add(1) + 1; }
  std::vector<int32_t> lost_peer_ranks() const override {
    return status().ok() ? std::vector<int32_t>() : lost_when_failed_;
  }

 private:
  std::atomic<int>* aborted_;
  std::atomic<int>* step_reads_;
  const absl::Notification* failed_;
  const std::vector<int32_t> lost_when_failed_;
  std::atomic<bool> done_{false};
};

// A run whose thread takes until `released` to end after an abort (as a run blocked in a
// rendezvous does): Done() stays false, and destroying it blocks, until then.
class SlowToAbortRun : public TrainingRun {
 public:
  explicit SlowToAbortRun(absl::Notification* released) : released_(released) {}
  ~SlowToAbortRun() override { released_->WaitForNotification(); }
  void Abort() override {}
  bool Done() const override { return released_->HasBeenNotified(); }
  absl::Status status() const override { return absl::OkStatus(); }
  int64_t step() const override { return 0; }
  std::vector<int32_t> lost_peer_ranks() const override { return {}; }

 private:
  absl::Notification* released_;
};

// Keeps a job's events (JobManager::Watch), for reading from the test's thread.
class RecordingSink : public coordinator::JobEventSink {
 public:
  bool OnEvent(const v1::JobEvent& event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
    return true;
  }
  void OnJobEnded() override {}
  std::vector<v1::JobEvent> Events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
};

// Polls `condition` every few milliseconds until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& condition,
                absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

class WorkerDaemonTest : public ::testing::Test {
 protected:
  // A coordinator on `port` whose state lives in a directory named after the port (and
  // `state_suffix`), so that a restart on the same port finds the state of the one before.
  void StartCoordinator(int port, absl::Duration adoption_window = absl::Seconds(30),
                        const std::string& state_suffix = "",
                        absl::Duration heartbeat_period = absl::Milliseconds(50),
                        absl::Duration dead_worker_retention = absl::Minutes(10)) {
    coordinator::CoordinatorServerOptions options;
    options.manager.forget_gone_workers_after = dead_worker_retention;
    options.listen_address = "127.0.0.1:" + std::to_string(port);
    options.metrics_port = -1;
    options.state_dir =
        std::string(std::getenv("TEST_TMPDIR")) + "/state-" + std::to_string(port) + state_suffix;
    options.manager.adoption_window = adoption_window;
    options.manager.lease.heartbeat_period = heartbeat_period;
    options.tick_period = absl::Milliseconds(10);
    if (with_tokens_) {
      // As clusters run: every caller authenticates, the daemon on the worker role.
      options.token_file = std::string(std::getenv("TEST_TMPDIR")) + "/tokens";
      std::ofstream(options.token_file) << kWorkerToken << " worker pool\n";
    }
    auto server = coordinator::CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<WorkerDaemon> MakeDaemon(
      int port, absl::Duration unregistered_unhealthy_after = absl::Minutes(5),
      const std::string& identity_file = "") {
    WorkerDaemonOptions options;
    options.identity_file = identity_file;
    options.name = "w";
    options.host = "host-a";
    options.register_retry = absl::Milliseconds(20);
    // Calls wait this long for a coordinator that is down, then fail.
    options.rpc_timeout = absl::Milliseconds(500);
    options.unregistered_unhealthy_after = unregistered_unhealthy_after;
    options.memory_limit_bytes = memory_limit_bytes_;
    // Reconnect quickly after a coordinator restart, as zeroshard-worker does.
    grpc::ChannelArguments channel_args;
    channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
    channel_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
    channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
    security::ClientCredentials credentials;
    if (with_tokens_) {
      credentials.token = kWorkerToken;
      options.worker_secret = std::make_shared<security::WorkerSecret>();
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = security::CreateCoordinatorChannel(
        "127.0.0.1:" + std::to_string(port), credentials, channel_args, options.worker_secret);
    EXPECT_TRUE(channel.ok()) << channel.status();
    auto stub = v1::Coordinator::NewStub(*channel);
    return std::make_unique<WorkerDaemon>(
        options, std::shared_ptr<v1::Coordinator::StubInterface>(std::move(stub)),
        [this](const v1::Assignment& assignment) {
          absl::MutexLock lock(&mu_);
          started_.push_back(assignment);
          return std::make_unique<FakeRun>(&aborted_, &step_reads_, &runs_failed_,
                                           lost_when_failed_);
        });
  }

  v1::JobSpec Spec() {
    v1::JobSpec spec;
    spec.set_name("job");
    spec.mutable_workload()->set_preset("seed");
    spec.mutable_optimizer()->set_kind(v1::SGD);
    return spec;
  }

  int Started() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(started_.size());
  }

  static constexpr char kWorkerToken[] = "worker-token-0123456789";
  // The coordinator authenticates callers (a token file) and the daemon holds a worker token.
  bool with_tokens_ = false;
  // The daemons' --memory_limit_bytes.
  int64_t memory_limit_bytes_ = 0;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  absl::Mutex mu_;
  std::vector<v1::Assignment> started_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> aborted_{0};
  std::atomic<int> step_reads_{0};
  absl::Notification runs_failed_;  // every FakeRun fails once notified
  // What the FakeRuns made from now on saw die when they failed.
  std::vector<int32_t> lost_when_failed_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerDaemonTest, RegistersOnceCoordinatorComesUpThenRunsAndAbortsOnCancel) {
  const int port = common::PickFreeLoopbackPortOrDie();
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  // The daemon is already retrying; the coordinator comes up afterwards.
  StartCoordinator(port);
  coordinator::JobManager* manager = server_->manager();
  ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
  auto job = manager->SubmitJob(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(started_[0].job_id(), job->id());
    EXPECT_EQ(started_[0].rank(), 0);
  }
  ASSERT_TRUE(manager->CancelJob(job->id(), "test").ok());
  ASSERT_TRUE(Eventually([&] { return aborted_.load() == 1; }));
  // Having stopped, the worker is idle again and takes the next job.
  auto next = manager->SubmitJob(Spec());
  ASSERT_TRUE(Eventually([&] { return Started() == 2; }));
  daemon->Stop();
  thread.join();
  EXPECT_EQ(aborted_.load(), 2);  // stopping aborts the running one
  EXPECT_TRUE(Eventually([&] { return manager->ListWorkers(v1::LEFT).size() == 1; }));
}

// Fails before the fix: workers did not report a memory limit, and SubmitJob accepted a job its
// idle workers could not hold. With the real coordinator over loopback: the limit reaches
// ListWorkers, a job above it is refused with the figures, and one below it runs.
TEST_F(WorkerDaemonTest, TheMemoryLimitIsRegisteredAndJobsAboveItAreRefusedAtSubmission) {
  memory_limit_bytes_ = int64_t{64} << 20;
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  coordinator::JobManager* manager = server_->manager();
  ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
  EXPECT_EQ(manager->ListWorkers(v1::IDLE)[0].memory_limit_bytes(), int64_t{64} << 20);
  // The deep preset under AdamW needs far more than 64 MiB per rank at W = 1.
  v1::JobSpec large = Spec();
  large.mutable_workload()->set_preset("deep");
  large.mutable_optimizer()->set_kind(v1::ADAMW);
  large.set_mode(v1::ZERO2);
  const absl::Status refused = manager->SubmitJob(large).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("spec.mode: ZERO2 needs"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("more than worker w's --memory_limit_bytes=64.0 MiB"),
            absl::string_view::npos)
      << refused;
  // The seed model fits: it is accepted and placed on the worker.
  auto job = manager->SubmitJob(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));
  daemon->Stop();
  thread.join();
}

TEST_F(WorkerDaemonTest, ARunThatFailsIsReportedAtOnceNotAtTheNextHeartbeat) {
  const int port = common::PickFreeLoopbackPortOrDie();
  // Heartbeats every 10 s: without the news path the job would succeed only at the next one.
  const absl::Duration period = absl::Seconds(10);
  StartCoordinator(port, absl::Seconds(30), "", period);
  coordinator::JobManager* manager = server_->manager();
  // Submitted first, so that the worker is placed when it registers and its first heartbeat
  // (at once after registering) brings the run.
  auto job = manager->SubmitJob(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));
  const absl::Time failed_at = absl::Now();
  runs_failed_.Notify();
  // The failure ends generation 1 (the job is then retried, or fails).
  ASSERT_TRUE(Eventually([&] {
    const v1::Job now = *manager->GetJob(job->id());
    return now.generation() >= 2 || now.state() == v1::FAILED;
  }));
  EXPECT_LT(absl::Now() - failed_at, period / 2);
  daemon->Stop();
  thread.join();
}

TEST_F(WorkerDaemonTest, AFailedRunReportsThePeersItSawDie) {
  const int port = common::PickFreeLoopbackPortOrDie();
  // Heartbeats every 10 s, and so a regroup wait and a lease far longer than the test: only the
  // report lets the next generation start without the dead rank's worker.
  const absl::Duration period = absl::Seconds(10);
  StartCoordinator(port, absl::Seconds(30), "", period);
  coordinator::JobManager* manager = server_->manager();
  {
    absl::MutexLock lock(&mu_);
    lost_when_failed_ = {1};
  }
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
  // Rank 1 of generation 1: a worker registered by hand on host-b, which never heartbeats (as
  // one killed -9 does, until its lease ends).
  v1::RegisterWorkerRequest dead;
  dead.set_name("dead");
  dead.set_host("host-b");
  dead.set_device_kind(v1::CPU);
  const std::string dead_id = manager->RegisterWorker(dead)->worker_id();
  v1::JobSpec spec = Spec();
  spec.set_min_workers(1);
  spec.set_max_workers(2);
  spec.set_global_batch(2);
  spec.set_max_attempts(5);
  auto job = manager->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));
  {
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(started_[0].world_size(), 2);
    ASSERT_EQ(started_[0].rank(), 0);
  }
  const absl::Time failed_at = absl::Now();
  runs_failed_.Notify();
  // Generation 2 starts on this worker alone, without waiting for rank 1's.
  ASSERT_TRUE(Eventually([&] { return manager->GetJob(job->id())->generation() >= 2; }));
  EXPECT_LT(absl::Now() - failed_at, period / 2);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager->Watch(job->id(), 0, sink).ok());
  std::vector<std::string> second;
  for (const v1::JobEvent& event : sink->Events()) {
    if (event.type() == v1::GENERATION_STARTED && event.generation() == 2) {
      second.assign(event.worker_ids().begin(), event.worker_ids().end());
    }
  }
  EXPECT_EQ(second, std::vector<std::string>{daemon->worker_id()});
  EXPECT_NE(daemon->worker_id(), dead_id);
  daemon->Stop();
  thread.join();
}

enum class Security { kPlaintext, kTokens };

// The tests of restarts and identities, run both as clusters run (a token file, the daemon on the
// worker role) and without authentication.
class WorkerIdentityTest : public WorkerDaemonTest, public ::testing::WithParamInterface<Security> {
 protected:
  void SetUp() override { with_tokens_ = GetParam() == Security::kTokens; }
};

INSTANTIATE_TEST_SUITE_P(Security, WorkerIdentityTest,
                         ::testing::Values(Security::kPlaintext, Security::kTokens),
                         [](const ::testing::TestParamInfo<Security>& info) {
                           return info.param == Security::kTokens ? "Tokens" : "Plaintext";
                         });

// With tokens this failed before issue 23: a restarted coordinator held no secrets and refused
// every heartbeat with PERMISSION_DENIED, forever, instead of answering NOT_FOUND.
TEST_P(WorkerIdentityTest, RegistersAgainWhenTheCoordinatorForgetsIt) {
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  ASSERT_TRUE(Eventually([&] { return server_->manager()->ListWorkers(v1::IDLE).size() == 1; }));
  const std::string first_id = server_->manager()->ListWorkers(v1::IDLE)[0].id();
  // A restarted coordinator (same state dir) knows no workers: the daemon gets NOT_FOUND on its
  // next heartbeat and registers again, under a new id.
  server_.reset();
  StartCoordinator(port);
  ASSERT_TRUE(Eventually([&] { return server_->manager()->ListWorkers(v1::IDLE).size() == 1; }));
  EXPECT_NE(server_->manager()->ListWorkers(v1::IDLE)[0].id(), first_id);
  EXPECT_TRUE(Eventually([&] { return daemon->worker_id() != first_id; }));
  daemon->Stop();
  thread.join();
}

// With tokens this failed before issue 23 (as above, so the run was never adopted).
TEST_P(WorkerIdentityTest, ARunOutlivesACoordinatorRestartAndIsAdopted) {
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  coordinator::JobManager* manager = server_->manager();
  ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
  auto job = manager->SubmitJob(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));
  const std::string id = daemon->worker_id();

  // The coordinator goes away; the daemon's heartbeats fail (each attempt reads the run's step),
  // and the run goes on.
  server_.reset();
  const int reads_before = step_reads_.load();
  ASSERT_TRUE(Eventually([&] { return step_reads_.load() >= reads_before + 3; }));
  EXPECT_EQ(aborted_.load(), 0);
  EXPECT_EQ(daemon->worker_id(), id);

  // Restarted on the same state, the coordinator adopts the run: same id, same run.
  StartCoordinator(port);
  manager = server_->manager();
  ASSERT_TRUE(Eventually([&] {
    return manager->GetJob(job->id())->message() ==
           "generation 1 adopted after a coordinator restart";
  }));
  EXPECT_EQ(daemon->worker_id(), id);
  EXPECT_EQ(aborted_.load(), 0);
  EXPECT_EQ(Started(), 1);
  const std::vector<v1::WorkerInfo> busy = manager->ListWorkers(v1::BUSY);
  ASSERT_EQ(busy.size(), 1u);
  EXPECT_EQ(busy[0].id(), id);
  EXPECT_EQ(manager->GetJob(job->id())->generation(), 1);
  daemon->Stop();
  thread.join();
}

TEST_P(WorkerIdentityTest, ARunTheRestartedCoordinatorCannotAdoptIsAborted) {
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  ASSERT_TRUE(Eventually([&] { return server_->manager()->ListWorkers(v1::IDLE).size() == 1; }));
  ASSERT_TRUE(server_->manager()->SubmitJob(Spec()).ok());
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));

  // A coordinator that lost the state knows no such job: the run is over for it. (It numbers
  // workers from 1 again, so the new id may even equal the old one.)
  server_.reset();
  StartCoordinator(port, absl::Seconds(30), "-lost");
  ASSERT_TRUE(Eventually([&] { return aborted_.load() == 1; }));
  EXPECT_TRUE(Eventually([&] { return server_->manager()->ListWorkers(v1::IDLE).size() == 1; }));
  EXPECT_EQ(Started(), 1);
  daemon->Stop();
  thread.join();
}

// Before issue 23 a daemon whose heartbeats were refused (PERMISSION_DENIED: its registration
// was replaced) beat in vain forever and kept its run. Now, after a whole lease of refusals, it
// aborts the run and registers as a new worker (waiting, ALREADY_EXISTS, while the registration
// that replaced it holds its name, and with tokens, since issue 36, until that one has been gone
// for the retention); meanwhile it is not ready, and not live once refused longer than
// unregistered_unhealthy_after.
TEST_P(WorkerIdentityTest, HeartbeatsRefusedForALeaseMakeANewWorker) {
  const int port = common::PickFreeLoopbackPortOrDie();
  // Leases of 3 x 200 ms: the refusals last a lease, then the name is held for another, and a
  // retention of 1 s after that.
  StartCoordinator(port, absl::Seconds(30), "", absl::Milliseconds(200), absl::Seconds(1));
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port, absl::Milliseconds(100));
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  coordinator::JobManager* manager = server_->manager();
  ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
  v1::JobSpec spec = Spec();
  spec.set_max_attempts(5);
  auto job = manager->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Eventually([&] { return Started() == 1; }));
  const std::string first_id = daemon->worker_id();
  EXPECT_TRUE(daemon->Liveness().ok());

  // An admin registers "w" again in the daemon's place (admins act for any worker): the
  // daemon's registration is over, its secret revoked.
  v1::RegisterWorkerRequest replacement;
  replacement.set_name("w");
  replacement.set_host("host-a");
  replacement.set_device_kind(v1::CPU);
  replacement.set_previous_worker_id(first_id);
  absl::StatusOr<v1::RegisterWorkerResponse> replaced = manager->RegisterWorker(replacement);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  ASSERT_NE(replaced->worker_id(), first_id);

  bool seen_unready = false;
  bool seen_unhealthy = false;
  ASSERT_TRUE(Eventually([&] {
    seen_unready = seen_unready || !daemon->Readiness().ok();
    seen_unhealthy = seen_unhealthy || !daemon->Liveness().ok();
    const std::string id = daemon->worker_id();
    return !id.empty() && id != first_id && id != replaced->worker_id() && daemon->Readiness().ok();
  }));
  // Refused (with tokens PERMISSION_DENIED for a lease, without them NOT_FOUND at once), then
  // ALREADY_EXISTS until the replacement's lease ended.
  EXPECT_TRUE(seen_unready);
  EXPECT_TRUE(seen_unhealthy);
  EXPECT_EQ(aborted_.load(), 1);
  // Live and healthy again; the job runs its next generation on the new registration.
  EXPECT_TRUE(daemon->Liveness().ok()) << daemon->Liveness();
  ASSERT_TRUE(Eventually([&] { return manager->GetJob(job->id())->generation() >= 2; }));
  ASSERT_TRUE(Eventually([&] {
    const std::vector<v1::WorkerInfo> busy = manager->ListWorkers(v1::BUSY);
    return busy.size() == 1 && busy[0].id() == daemon->worker_id();
  }));
  daemon->Stop();
  thread.join();
}

// Issue 36, row 1. Fails before the fix: once the daemon named "w" was gone (stopped here; a
// kill leaves it DEAD, which counts alike), a worker token registered "w" without any proof and
// held it, and the restarted daemon was refused ALREADY_EXISTS for as long as that one beat. Now
// the name waits for its holder, and the restarted daemon proves it is that worker with the
// identity its previous process kept in --identity_file.
TEST_F(WorkerDaemonTest, ARestartedDaemonGetsItsNameBackWithItsIdentityFile) {
  with_tokens_ = true;
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  coordinator::JobManager* manager = server_->manager();
  const std::string identity = std::string(std::getenv("TEST_TMPDIR")) + "/w.identity";
  std::filesystem::remove(identity);
  std::string first_id;
  {
    std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port, absl::Minutes(5), identity);
    std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
    ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
    first_id = daemon->worker_id();
    daemon->Stop();
    thread.join();
  }
  ASSERT_EQ(manager->ListWorkers(v1::LEFT).size(), 1u);
  v1::RegisterWorkerRequest squat;
  squat.set_name("w");
  squat.set_host("elsewhere");
  squat.set_device_kind(v1::CPU);
  coordinator::RegistrationProof token_only;
  token_only.acts_for_any_worker = false;
  const absl::Status squatted = manager->RegisterWorker(squat, token_only).status();
  EXPECT_EQ(squatted.code(), absl::StatusCode::kAlreadyExists) << squatted;

  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port, absl::Minutes(5), identity);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
  const v1::WorkerInfo back = manager->ListWorkers(v1::IDLE)[0];
  EXPECT_EQ(back.name(), "w");
  EXPECT_EQ(back.host(), "host-a");
  EXPECT_NE(back.id(), first_id);
  EXPECT_TRUE(daemon->Liveness().ok());
  daemon->Stop();
  thread.join();
}

// Issue 36, row 1: a restarted daemon that kept no identity is refused its own name while the
// name is held for its previous registration; it says why (Readiness, and its log) and registers
// by itself once that registration has been gone for the coordinator's retention. Fails before
// the fix: the name of a LEFT worker was anyone's at once, so no refusal was ever seen (and a
// squatter could have taken it just as well).
TEST_F(WorkerDaemonTest, ADaemonWithoutItsIdentityGetsItsNameOnceTheRetentionPassed) {
  with_tokens_ = true;
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port, absl::Seconds(30), "", absl::Milliseconds(50), absl::Seconds(2));
  coordinator::JobManager* manager = server_->manager();
  {
    std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
    std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
    ASSERT_TRUE(Eventually([&] { return manager->ListWorkers(v1::IDLE).size() == 1; }));
    daemon->Stop();
    thread.join();
  }
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon(port);
  std::thread thread([&] { EXPECT_TRUE(daemon->Run().ok()); });
  std::string refusal;
  ASSERT_TRUE(Eventually([&] {
    const absl::Status ready = daemon->Readiness();
    if (absl::StrContains(ready.message(), "held by proof")) refusal = ready.ToString();
    return manager->ListWorkers(v1::IDLE).size() == 1;
  }));
  EXPECT_TRUE(absl::StrContains(refusal, "--dead_worker_retention")) << refusal;
  EXPECT_EQ(manager->ListWorkers(v1::IDLE)[0].name(), "w");
  daemon->Stop();
  thread.join();
}

TEST_F(WorkerDaemonTest, StopEndsAHeartbeatWaitingForTheCoordinator) {
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  WorkerDaemonOptions options;
  options.name = "w";
  options.host = "host-a";
  options.rpc_timeout = absl::Minutes(10);  // a heartbeat would wait this long for a coordinator
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  WorkerDaemon daemon(options, std::shared_ptr<v1::Coordinator::StubInterface>(std::move(stub)),
                      [this](const v1::Assignment&) -> std::unique_ptr<TrainingRun> {
                        return std::make_unique<FakeRun>(&aborted_, &step_reads_, &runs_failed_);
                      });
  absl::Notification returned;
  std::thread thread([&] {
    EXPECT_TRUE(daemon.Run().ok());
    returned.Notify();
  });
  ASSERT_TRUE(server_->manager()->SubmitJob(Spec()).ok());
  ASSERT_TRUE(Eventually([&] { return step_reads_.load() > 0; }));  // running, heartbeating
  server_.reset();
  // A heartbeat that began after the coordinator went away waits for it; Stop() ends it.
  const int reads = step_reads_.load();
  ASSERT_TRUE(Eventually([&] { return step_reads_.load() > reads; }));
  daemon.Stop();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(20)));
  thread.join();
  EXPECT_EQ(aborted_.load(), 1);  // stopping aborts the run
}

TEST_F(WorkerDaemonTest, SlowAbortDoesNotStallHeartbeatsOrTheNextRun) {
  const int port = common::PickFreeLoopbackPortOrDie();
  StartCoordinator(port);
  absl::Notification released;
  std::atomic<int> runs{0};
  WorkerDaemonOptions options;
  options.name = "w";
  options.host = "host-a";
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  WorkerDaemon daemon(options, std::shared_ptr<v1::Coordinator::StubInterface>(std::move(stub)),
                      [&](const v1::Assignment&) -> std::unique_ptr<TrainingRun> {
                        runs.fetch_add(1);
                        return std::make_unique<SlowToAbortRun>(&released);
                      });
  std::thread thread([&] { EXPECT_TRUE(daemon.Run().ok()); });
  coordinator::JobManager* manager = server_->manager();
  auto first = manager->SubmitJob(Spec());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  ASSERT_TRUE(manager->CancelJob(first->id(), "test").ok());
  // The first run has not ended (it never will until released), yet the daemon keeps beating
  // and starts the next job's run.
  auto second = manager->SubmitJob(Spec());
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(Eventually([&] { return runs.load() == 2; })) << "daemon stalled on the abort";
  EXPECT_EQ(manager->ListWorkers(v1::DEAD).size(), 0u);
  released.Notify();
  daemon.Stop();
  thread.join();
}

// Stands in for a coordinator that authenticates workers: RegisterWorker needs a bearer token and
// hands out a fresh secret each time; Heartbeat records the secret it got and, once, answers
// NOT_FOUND (a coordinator that forgot the worker) so that the daemon registers again.
// Thread-safe (gRPC's threads call it; the test reads it).
class SecretIssuingCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext* context, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    const auto& metadata = context->client_metadata();
    if (metadata.find(security::kAuthorizationKey) == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no credentials");
    }
    absl::MutexLock lock(&mu_);
    ++registrations_;
    response->set_worker_id("worker-000001");
    response->set_worker_secret(absl::StrCat("secret-of-registration-", registrations_));
    response->set_heartbeat_period_ms(10);
    response->set_lease_ms(1000);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    const auto& metadata = context->client_metadata();
    auto secret = metadata.find(security::kWorkerSecretKey);
    absl::MutexLock lock(&mu_);
    heartbeat_secrets_.push_back(
        secret == metadata.end() ? "" : std::string(secret->second.data(), secret->second.size()));
    if (heartbeat_secrets_.size() == 3) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    }
    return grpc::Status::OK;
  }

  std::vector<std::string> heartbeat_secrets() {
    absl::MutexLock lock(&mu_);
    return heartbeat_secrets_;
  }

 private:
  absl::Mutex mu_;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> heartbeat_secrets_ ABSL_GUARDED_BY(mu_);
};

class WorkerCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<WorkerDaemon> MakeDaemon(const std::string& token) {
    WorkerDaemonOptions options;
    options.name = "w";
    options.host = "host-a";
    options.register_retry = absl::Milliseconds(20);
    options.rpc_timeout = absl::Seconds(5);
    options.worker_secret = std::make_shared<security::WorkerSecret>();
    security::ClientCredentials credentials;
    credentials.token = token;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        security::CreateCoordinatorChannel(absl::StrCat("127.0.0.1:", port_), credentials,
                                           grpc::ChannelArguments(), options.worker_secret);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return std::make_unique<WorkerDaemon>(
        options,
        std::shared_ptr<v1::Coordinator::StubInterface>(v1::Coordinator::NewStub(*channel)),
        [](const v1::Assignment&) -> std::unique_ptr<TrainingRun> { return nullptr; });
  }

  SecretIssuingCoordinator service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(WorkerCredentialsTest, EveryCallCarriesTheLatestRegistrationsSecret) {
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon("worker-token-0123456789");
  absl::Status result;
  std::thread runner([&] { result = daemon->Run(); });
  // Heartbeats 1-2 follow registration 1; the third is refused (NOT_FOUND), the daemon registers
  // again, and the heartbeats after it carry registration 2's secret.
  const bool enough = Eventually([&] { return service_.heartbeat_secrets().size() >= 6; });
  daemon->Stop();
  runner.join();
  ASSERT_TRUE(enough);
  EXPECT_TRUE(result.ok()) << result;
  const std::vector<std::string> secrets = service_.heartbeat_secrets();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(secrets[i], "secret-of-registration-1") << i;
  for (size_t i = 3; i < secrets.size(); ++i) {
    EXPECT_EQ(secrets[i], "secret-of-registration-2") << i;
  }
}

TEST_F(WorkerCredentialsTest, RefusedCredentialsEndTheDaemon) {
  std::unique_ptr<WorkerDaemon> daemon = MakeDaemon("");
  // No retrying: Run returns the refusal by itself (a hang here would time the test out).
  const absl::Status result = daemon->Run();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnauthenticated) << result;
  EXPECT_TRUE(service_.heartbeat_secrets().empty());
}

}  // namespace
}  // namespace zeroshard::worker
