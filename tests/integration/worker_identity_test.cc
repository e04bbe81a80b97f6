// Issue 23 on real processes, run as clusters run: a coordinator serving TLS with a token file,
// worker daemons holding a token of the worker role, and an outside caller holding that same
// worker token (but no worker's secret). A worker token names no worker: it cannot unseat a live
// worker, nor take over a running rank after a coordinator restart; and a restart, or a worker
// forgotten after its retention, no longer leaves the workers refused forever. Issue 36: nor can it
// take the name of a worker that is not live (killed, or not back yet after a coordinator
// restart): a name is held by proof, as a rank is.
#include <signal.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_credentials.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

using ::google::protobuf::util::TimeUtil;

// Short leases (3 x 200 ms), so that a worker that lost its registration shows it quickly.
constexpr absl::Duration kHeartbeatPeriod = absl::Milliseconds(200);
const absl::Duration kLease = kHeartbeatPeriod * 3;
// Generous for a loaded 2-core machine.
constexpr absl::Duration kDeadline = absl::Seconds(90);
constexpr absl::Duration kRpcDeadline = absl::Seconds(10);

v1::JobSpec SeedJob(const std::string& name, int workers, int64_t steps) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(0.001);
  spec.set_mode(v1::ZERO2);
  spec.set_min_workers(workers);
  spec.set_max_workers(workers);
  spec.set_global_batch(64);
  spec.set_steps(steps);
  spec.set_max_attempts(3);
  return spec;
}

absl::Time TimeOf(const google::protobuf::Timestamp& timestamp) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(timestamp));
}

class WorkerIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ClusterCredentials> credentials =
        MakeClusterCredentials(absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki"));
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    credentials_ = *std::move(credentials);
  }

  LocalClusterOptions Options(std::vector<std::string> coordinator_flags = {}) const {
    LocalClusterOptions options;
    options.heartbeat_period = kHeartbeatPeriod;
    options.security = credentials_.security;
    options.extra_coordinator_flags = std::move(coordinator_flags);
    return options;
  }

  // An outside caller with the worker token and no worker's secret (or `secret`).
  std::unique_ptr<v1::Coordinator::Stub> Intruder(const LocalCluster& cluster,
                                                  const std::string& secret = "") const {
    return CallerStub(credentials_, cluster.coordinator_target(), credentials_.worker_token,
                      secret);
  }

  static grpc::Status Register(v1::Coordinator::Stub& stub,
                               const v1::RegisterWorkerRequest& request,
                               v1::RegisterWorkerResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
    return stub.RegisterWorker(&context, request, response);
  }

  static v1::RegisterWorkerRequest Claim(const std::string& name,
                                         const std::string& previous_worker_id) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_host("intruder-host");
    request.set_device_kind(v1::CPU);
    request.set_previous_worker_id(previous_worker_id);
    return request;
  }

  ClusterCredentials credentials_;
};

// Before issue 23, RegisterWorker with previous_worker_id revoked that worker's secret without
// proof: the live worker was DEAD a lease later (its heartbeats refused), and a running job's
// generation ended and restarted from step 0.
TEST_F(WorkerIdentityTest, AWorkerTokenCannotUnseatALiveWorker) {
  LocalCluster cluster(Options());
  LogTailsOnFailure tails(cluster);
  ASSERT_TRUE(cluster.Start(2).ok());
  // worker-0 or worker-1 runs a long job; the other stays idle.
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(SeedJob("long", 1, 1000000));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<v1::Job> running = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return job.progress().step() > 0; }, kDeadline,
      "training");
  ASSERT_TRUE(running.ok()) << running.status();
  absl::StatusOr<std::vector<v1::WorkerInfo>> before =
      cluster.client().ListWorkers(v1::WORKER_STATE_UNSPECIFIED);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->size(), 2u);

  std::unique_ptr<v1::Coordinator::Stub> intruder = Intruder(cluster);
  const absl::Time attack = absl::Now();
  for (const v1::WorkerInfo& victim : *before) {
    SCOPED_TRACE(victim.ShortDebugString());
    // Its name: refused while it is live, naming the holder.
    v1::RegisterWorkerResponse response;
    const grpc::Status same_name =
        Register(*intruder, Claim(victim.name(), victim.id()), &response);
    EXPECT_EQ(same_name.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_TRUE(absl::StrContains(same_name.error_message(), victim.id()))
        << same_name.error_message();
    // Its id under another name (and with its run, for the busy one): a new worker, nothing
    // adopted, nothing revoked.
    v1::RegisterWorkerRequest claim = Claim(absl::StrCat("intruder-", victim.name()), victim.id());
    if (victim.state() == v1::BUSY) {
      claim.mutable_status()->set_job_id(running->id());
      claim.mutable_status()->set_generation(running->generation());
      claim.mutable_status()->set_rank(0);
    }
    const grpc::Status other_name = Register(*intruder, claim, &response);
    ASSERT_TRUE(other_name.ok()) << other_name.error_message();
    EXPECT_NE(response.worker_id(), victim.id());
    EXPECT_FALSE(response.adopted());
  }

  // Both victims keep beating for two leases after the attack, under their ids, and the job
  // stays in its first generation.
  absl::Status kept = cluster.WaitFor(
      [&] {
        for (const v1::WorkerInfo& victim : *before) {
          absl::StatusOr<v1::WorkerInfo> now = cluster.FindWorker(victim.name());
          if (!now.ok() || now->id() != victim.id() ||
              TimeOf(now->last_heartbeat_time()) < attack + 2 * kLease) {
            return false;
          }
        }
        return true;
      },
      kDeadline, "both workers beating two leases after the attack");
  ASSERT_TRUE(kept.ok()) << kept;
  for (const v1::WorkerInfo& victim : *before) {
    absl::StatusOr<v1::WorkerInfo> now = cluster.FindWorker(victim.name());
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_EQ(now->state(), victim.state()) << now->ShortDebugString();
  }
  absl::StatusOr<v1::Job> after = cluster.client().GetJob(submitted->id());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::RUNNING) << after->message();
  EXPECT_EQ(after->generation(), 1);
  EXPECT_EQ(after->attempts(), 1);
  EXPECT_GE(after->progress().step(), running->progress().step());
  ASSERT_TRUE(cluster.client().CancelJob(submitted->id(), "done").ok());
  EXPECT_TRUE(cluster.StopAll().ok());
}

// Before issue 23, a coordinator restarted with a token file refused every heartbeat with
// PERMISSION_DENIED forever (it held no secrets, and the daemon re-registers only on NOT_FOUND):
// the running generation was never adopted, and no new job could run. And during the adoption
// window a registration from another name and host that claimed a rank (previous_worker_id and
// status) was adopted into it with a fresh secret, with which it reported progress.
TEST_F(WorkerIdentityTest, ARestartWithTokensAdoptsTheRunOnlyFromItsOwnWorkers) {
  LocalCluster cluster(Options({"--adoption_window=120s"}));
  LogTailsOnFailure tails(cluster);
  ASSERT_TRUE(cluster.Start(2).ok());
  constexpr int64_t kSteps = 3000;
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(SeedJob("adopted", 2, kSteps));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<v1::Job> running = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return job.progress().step() >= 20; }, kDeadline,
      "training");
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->worker_ids_size(), 2);
  std::vector<v1::WorkerInfo> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<int> index = cluster.WorkerIndexOf(running->worker_ids(rank));
    ASSERT_TRUE(index.ok()) << index.status();
    absl::StatusOr<v1::WorkerInfo> info = cluster.FindWorker(absl::StrCat("worker-", *index));
    ASSERT_TRUE(info.ok()) << info.status();
    ranks.push_back(*info);
  }

  // The workers pause (so that the claims below come first), and the coordinator dies.
  for (int index : {0, 1}) ASSERT_TRUE(cluster.KillWorker(index, SIGSTOP).ok());
  for (int index : {0, 1}) ASSERT_TRUE(cluster.WaitForWorkerStopped(index, kDeadline).ok());
  ASSERT_TRUE(cluster.StopCoordinator(SIGKILL).ok());
  ASSERT_TRUE(cluster.StartCoordinator().ok());

  // Claims of rank 0 with the worker token: without a secret, with a made-up one, under rank 0's
  // own name. None is adopted.
  v1::RegisterWorkerRequest claim = Claim("intruder", ranks[0].id());
  claim.mutable_status()->set_job_id(running->id());
  claim.mutable_status()->set_generation(running->generation());
  claim.mutable_status()->set_rank(0);
  claim.mutable_status()->set_step(running->progress().step());
  v1::RegisterWorkerResponse intruder_registration;
  const grpc::Status no_secret = Register(*Intruder(cluster), claim, &intruder_registration);
  ASSERT_TRUE(no_secret.ok()) << no_secret.error_message();
  EXPECT_FALSE(intruder_registration.adopted());
  EXPECT_NE(intruder_registration.worker_id(), ranks[0].id());
  claim.set_name("intruder-2");
  v1::RegisterWorkerResponse guessed;
  const grpc::Status made_up = Register(*Intruder(cluster, std::string(64, 'a')), claim, &guessed);
  ASSERT_TRUE(made_up.ok()) << made_up.error_message();
  EXPECT_FALSE(guessed.adopted());
  claim.set_name(ranks[0].name());
  v1::RegisterWorkerResponse unused;
  const grpc::Status same_name = Register(*Intruder(cluster), claim, &unused);
  EXPECT_EQ(same_name.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_TRUE(absl::StrContains(same_name.error_message(), "reserved"))
      << same_name.error_message();
  // The intruder's own secret reports nothing for the job.
  {
    v1::ReportProgressRequest report;
    report.set_worker_id(intruder_registration.worker_id());
    report.set_job_id(running->id());
    report.set_generation(running->generation());
    report.set_rank(0);
    report.mutable_metrics()->set_step(running->progress().step() + 1);
    report.mutable_metrics()->set_loss(0.5);
    report.mutable_metrics()->set_loss_scale(1);
    v1::ReportProgressResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
    const grpc::Status reported = Intruder(cluster, intruder_registration.worker_secret())
                                      ->ReportProgress(&context, report, &response);
    EXPECT_EQ(reported.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << reported.error_message();
    EXPECT_TRUE(absl::StrContains(reported.error_message(), "rank 0")) << reported.error_message();
  }

  // The workers go on: their heartbeats get NOT_FOUND, they re-register with their ids and
  // secrets, and the generation is adopted; the job ends in it.
  for (int index : {0, 1}) ASSERT_TRUE(cluster.KillWorker(index, SIGCONT).ok());
  const std::set<std::string> rank_ids = {ranks[0].id(), ranks[1].id()};
  absl::Status adopted = cluster.WaitForBusyWorkerIds(rank_ids, kDeadline);
  ASSERT_TRUE(adopted.ok()) << adopted;
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); }, kDeadline,
      "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_EQ(ended->generation(), 1);
  EXPECT_EQ(ended->attempts(), 1);
  EXPECT_EQ(ended->progress().step(), kSteps);

  // The cluster schedules again: a new job runs on both workers.
  absl::StatusOr<v1::Job> next = cluster.client().SubmitJob(SeedJob("next", 2, 20));
  ASSERT_TRUE(next.ok()) << next.status();
  absl::StatusOr<v1::Job> next_ended = cluster.WaitForJob(
      next->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); }, kDeadline,
      "ended");
  ASSERT_TRUE(next_ended.ok()) << next_ended.status();
  EXPECT_EQ(next_ended->state(), v1::SUCCEEDED) << next_ended->message();
  EXPECT_TRUE(cluster.StopAll().ok());
}

// Before issue 23, a worker forgotten after --dead_worker_retention (it was DEAD, e.g. paused
// past its lease) got PERMISSION_DENIED on every heartbeat, forever. Now it gets NOT_FOUND and
// registers again.
TEST_F(WorkerIdentityTest, AWorkerForgottenAfterItsRetentionRegistersAgain) {
  LocalCluster cluster(Options({"--dead_worker_retention=1s"}));
  LogTailsOnFailure tails(cluster);
  ASSERT_TRUE(cluster.Start(1).ok());
  absl::StatusOr<v1::WorkerInfo> first = cluster.FindWorker("worker-0");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(cluster.KillWorker(0, SIGSTOP).ok());
  absl::Status forgotten =
      cluster.WaitFor([&] { return absl::IsNotFound(cluster.FindWorker("worker-0").status()); },
                      kDeadline, "worker-0 forgotten");
  ASSERT_TRUE(forgotten.ok()) << forgotten;
  ASSERT_TRUE(cluster.KillWorker(0, SIGCONT).ok());
  absl::Status back = cluster.WaitFor(
      [&] {
        absl::StatusOr<v1::WorkerInfo> now = cluster.FindWorker("worker-0");
        return now.ok() && now->state() == v1::IDLE && now->id() != first->id();
      },
      kDeadline, "worker-0 registered again");
  ASSERT_TRUE(back.ok()) << back;
  EXPECT_TRUE(cluster.StopAll().ok());
}

// Issue 36, row 1, across a daemon kill. Fails before the fix: a worker token registered the
// killed worker's name as soon as it was DEAD and kept it by heartbeating; the restarted daemon was
// refused ALREADY_EXISTS forever. Now the name waits for its holder: the daemon restarted with its
// --identity_file proves it is that worker and gets it back at once, and one restarted without
// it says why it is refused and registers by itself once the retention passed.
TEST_F(WorkerIdentityTest, AKilledWorkersNameIsHeldForItUntilItsRetentionPassed) {
  constexpr absl::Duration kRetention = absl::Seconds(8);
  LocalCluster cluster(
      Options({absl::StrCat("--dead_worker_retention=", absl::FormatDuration(kRetention))}));
  LogTailsOnFailure tails(cluster);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const std::vector<std::string> kept = {"--identity_file=" + cluster.base_dir() +
                                         "/worker-0.identity"};
  absl::StatusOr<int> keeper = cluster.StartWorker("worker-0", kept, {});
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  absl::StatusOr<int> forgetter = cluster.StartWorker("worker-1");
  ASSERT_TRUE(forgetter.ok()) << forgetter.status();
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2, kDeadline).ok());
  absl::StatusOr<v1::WorkerInfo> first = cluster.FindWorker("worker-0");
  ASSERT_TRUE(first.ok()) << first.status();

  for (int index : {*keeper, *forgetter}) ASSERT_TRUE(cluster.KillWorker(index, SIGKILL).ok());
  ASSERT_TRUE(cluster.WaitForWorkerStates({"worker-0", "worker-1"}, v1::DEAD, kDeadline).ok());
  std::unique_ptr<v1::Coordinator::Stub> intruder = Intruder(cluster);
  for (const char* name : {"worker-0", "worker-1"}) {
    v1::RegisterWorkerResponse response;
    const grpc::Status squatted = Register(*intruder, Claim(name, ""), &response);
    EXPECT_EQ(squatted.error_code(), grpc::StatusCode::ALREADY_EXISTS) << name;
    EXPECT_TRUE(absl::StrContains(squatted.error_message(), "held by proof"))
        << squatted.error_message();
  }

  // worker-0 is back at once, proving itself with its identity file.
  const absl::Time restarted = absl::Now();
  absl::StatusOr<int> keeper_again = cluster.StartWorker("worker-0", kept, {});
  ASSERT_TRUE(keeper_again.ok()) << keeper_again.status();
  absl::StatusOr<int> forgetter_again = cluster.StartWorker("worker-1");
  ASSERT_TRUE(forgetter_again.ok()) << forgetter_again.status();
  ASSERT_TRUE(cluster.WaitForWorkerStates({"worker-0"}, v1::IDLE, kDeadline).ok());
  absl::StatusOr<v1::WorkerInfo> back = cluster.FindWorker("worker-0");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->id(), first->id());
  EXPECT_NE(back->host(), "intruder-host");
  EXPECT_LT(absl::Now() - restarted, kRetention);
  // worker-1 kept no identity: refused, saying why, until the retention passed; then it is back
  // without anyone's help.
  ASSERT_TRUE(cluster.WaitForWorkerStates({"worker-1"}, v1::IDLE, kDeadline).ok());
  absl::StatusOr<v1::WorkerInfo> waited = cluster.FindWorker("worker-1");
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_NE(waited->host(), "intruder-host");
  std::ifstream log(cluster.worker_process(*forgetter_again).log_path);
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(absl::StrContains(text, "registration refused: name: worker name worker-1"));
  EXPECT_TRUE(absl::StrContains(text, "--identity_file")) << text;
  EXPECT_TRUE(cluster.StopAll().ok());
}

// Issue 36, row 1, across a coordinator restart. Fails before the fix: the restarted coordinator
// knew no names, a worker token that registered first took worker-0's, and worker-0, re-registering
// with its id and secret, was refused ALREADY_EXISTS forever (and its /healthz turned 503). Names
// are stored with their holders now: the intruder is refused, both workers are back under their
// names, and a job runs on them.
TEST_F(WorkerIdentityTest, ARestartedCoordinatorKeepsEachNameForItsWorker) {
  LocalCluster cluster(Options());
  LogTailsOnFailure tails(cluster);
  ASSERT_TRUE(cluster.Start(2).ok());
  absl::StatusOr<v1::WorkerInfo> first = cluster.FindWorker("worker-0");
  ASSERT_TRUE(first.ok()) << first.status();
  // The workers pause, so that the intruder comes first after the restart.
  for (int index : {0, 1}) ASSERT_TRUE(cluster.KillWorker(index, SIGSTOP).ok());
  for (int index : {0, 1}) ASSERT_TRUE(cluster.WaitForWorkerStopped(index, kDeadline).ok());
  ASSERT_TRUE(cluster.StopCoordinator(SIGKILL).ok());
  ASSERT_TRUE(cluster.StartCoordinator().ok());

  v1::RegisterWorkerResponse response;
  const grpc::Status squatted = Register(*Intruder(cluster), Claim("worker-0", ""), &response);
  EXPECT_EQ(squatted.error_code(), grpc::StatusCode::ALREADY_EXISTS) << squatted.error_message();
  EXPECT_TRUE(absl::StrContains(squatted.error_message(), first->id())) << squatted.error_message();
  // A name no worker held is anyone's.
  const grpc::Status fresh = Register(*Intruder(cluster), Claim("fresh-name", ""), &response);
  EXPECT_TRUE(fresh.ok()) << fresh.error_message();

  for (int index : {0, 1}) ASSERT_TRUE(cluster.KillWorker(index, SIGCONT).ok());
  ASSERT_TRUE(cluster.WaitForWorkerStates({"worker-0", "worker-1"}, v1::IDLE, kDeadline).ok());
  for (const char* name : {"worker-0", "worker-1"}) {
    absl::StatusOr<v1::WorkerInfo> back = cluster.FindWorker(name);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_NE(back->host(), "intruder-host") << name;
  }
  absl::StatusOr<v1::Job> job = cluster.client().SubmitJob(SeedJob("after", 2, 20));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      job->id(), [](const v1::Job& j) { return IsFinalJobState(j.state()); }, kDeadline, "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_TRUE(cluster.StopAll().ok());
}

}  // namespace
}  // namespace zeroshard::testing
