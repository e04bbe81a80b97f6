// Tests for the job manager on a fake clock with a real SQLite store: scheduling into
// generations, level-triggered assignments, completion, cancellation, lost workers and the
// regrouping of their survivors, restarts and the adoption of running generations after them,
// every edge of the job state machine, and attached jobs on their pinned workers.
#include "coordinator/job_manager.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/manifest.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {

// Reaches JobManager's private SetStateLocked, the only way to ask for an edge that no public
// method takes. Thread-safe as JobManager is: it takes the manager's mutex.
class JobManagerTestPeer {
 public:
  static absl::Status SetState(JobManager& manager, const std::string& job_id, v1::JobState state) {
    absl::MutexLock lock(&manager.mu_);
    absl::StatusOr<JobManager::JobRecord*> record = manager.FindJobLocked(job_id);
    if (!record.ok()) return record.status();
    return manager.SetStateLocked(**record, state, "forced by the test");
  }
};

namespace {

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/job_manager_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

v1::JobSpec SeedSpec(int workers) {
  v1::JobSpec spec;
  spec.set_name("seed-job");
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::SGD);
  spec.mutable_optimizer()->set_lr(0.01);
  spec.set_min_workers(workers);
  spec.set_steps(10);
  return spec;
}

// A job an earlier coordinator stored whose spec cannot be planned (its preset is unknown), though
// it fits one idle CPU worker: the scheduler places it and planning fails.
v1::Job UnplannableJob(v1::JobState state) {
  v1::Job job;
  job.set_id("job-000001");
  job.set_state(state);
  v1::JobSpec& spec = *job.mutable_spec();
  spec = SeedSpec(1);
  spec.mutable_workload()->set_preset("no-such-preset");
  spec.set_max_workers(1);
  spec.set_global_batch(1);
  spec.set_device_kind(v1::CPU);
  spec.set_max_attempts(3);
  return job;
}

// An attached model's spec (as a trainer would submit it) pinned to `workers` in rank order.
v1::JobSpec AttachedSpec(const std::vector<std::string>& workers) {
  v1::JobSpec spec;
  spec.set_name("torch-job");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  v1::AttachedModel& attached = *spec.mutable_workload()->mutable_attached();
  const std::pair<const char*, std::vector<int64_t>> tensors[] = {
      {"fc2.bias", {10}}, {"fc2.weight", {10, 64}}, {"fc1.bias", {64}}, {"fc1.weight", {64, 10}}};
  for (const auto& [name, shape] : tensors) {
    v1::AttachedTensor& tensor = *attached.add_tensors();
    tensor.set_name(name);
    for (int64_t dim : shape) tensor.add_shape(dim);
  }
  for (const std::string& worker : workers) attached.add_workers(worker);
  return spec;
}

std::string SocketOf(const std::string& name) { return "/run/zeroshard/" + name + ".sock"; }

// How a worker holding a rank is lost.
enum class Loss { kLeft, kLeaseExpired, kRunFailed };

std::string LossName(Loss loss) {
  switch (loss) {
    case Loss::kLeft:
      return "left";
    case Loss::kLeaseExpired:
      return "lease-expired";
    case Loss::kRunFailed:
      return "run-failed";
  }
  return "unknown";
}

// Collects events; can be closed to simulate a watcher that went away.
class RecordingSink : public JobEventSink {
 public:
  bool OnEvent(const v1::JobEvent& event) override {
    events.push_back(event);
    return open;
  }
  void OnJobEnded() override { ended = true; }
  std::vector<v1::JobEvent> events;
  bool ended = false;
  bool open = true;
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Start(FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }

  // Starts a manager on an empty state dir named after the test and `suffix`.
  void StartFresh(const std::string& suffix) {
    Start(FreshDir(absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                "-", suffix)));
  }

  // Starts a manager on a state dir that already holds `job` and one STATE_CHANGED event per
  // state of `history`, as a coordinator restarted on an earlier one's state would.
  void StartWithStoredJob(const v1::Job& job, const std::vector<v1::JobState>& history) {
    const std::string dir = FreshDir(
        absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "-stored"));
    {
      auto store = JobStore::Open(dir);
      ASSERT_TRUE(store.ok()) << store.status();
      std::vector<v1::JobEvent> events;
      for (v1::JobState state : history) {
        v1::JobEvent& event = events.emplace_back();
        event.set_job_id(job.id());
        event.set_sequence(static_cast<int64_t>(events.size()));
        event.set_type(v1::STATE_CHANGED);
        event.set_state(state);
      }
      const v1::Job* jobs[] = {&job};
      ASSERT_TRUE((*store)->Save(jobs, events).ok());
    }
    Start(dir);
  }

  void Start(const std::string& dir) {
    dir_ = dir;
    manager_.reset();
    rendezvous_ = std::make_unique<RendezvousStore>(&clock_);
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    JobManagerOptions options;
    checkpoint_root_ = dir + "/checkpoints";
    if (with_checkpoint_root_) options.checkpoint_root = checkpoint_root_;
    options.regroup_wait = regroup_wait_;
    options.max_events_per_job = max_events_per_job_;
    options.max_notices_per_generation = max_notices_per_generation_;
    auto manager = JobManager::Create(&clock_, *std::move(store), rendezvous_.get(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
  }

  // Writes rank `rank`'s file of `step` for `job` where its worker would (a few bytes) and
  // returns the commit that rank would send.
  v1::CommitCheckpointRequest WrittenCommit(const v1::Job& job, int rank, int64_t step) {
    const std::string relative =
        absl::StrCat(job.spec().checkpoint().dir(), "/", checkpoint::StepDirName(step), "/",
                     checkpoint::ShardFileName(rank, job.worker_ids_size()));
    const std::filesystem::path path = std::filesystem::path(checkpoint_root_) / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << "the shard of rank " << rank;
    v1::CommitCheckpointRequest commit;
    commit.set_worker_id(job.worker_ids(rank));
    commit.set_job_id(job.id());
    commit.set_generation(job.generation());
    commit.set_rank(rank);
    commit.set_step(step);
    commit.set_path(relative);
    commit.set_bytes(static_cast<int64_t>(std::filesystem::file_size(path)));
    return commit;
  }

  std::string Register(const std::string& name, const std::string& host = "host-a") {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_host(host);
    request.set_device_kind(v1::CPU);
    absl::StatusOr<v1::RegisterWorkerResponse> registered = manager_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? registered->worker_id() : "";
  }

  v1::Assignment Beat(const std::string& worker_id, const std::string& running_job = "",
                      int64_t generation = 0) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.mutable_status()->set_job_id(running_job);
    request.mutable_status()->set_generation(generation);
    auto response = manager_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->assignment() : v1::Assignment();
  }

  // A worker that serves attached trainers on SocketOf(name) (or on none, when `socket` is "").
  std::string RegisterAttachable(const std::string& name, const std::string& host = "host-a",
                                 std::optional<std::string> socket = std::nullopt,
                                 v1::DeviceKind kind = v1::CPU) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_host(host);
    request.set_device_kind(kind);
    request.set_attach_socket(socket.value_or(SocketOf(name)));
    absl::StatusOr<v1::RegisterWorkerResponse> registered = manager_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? registered->worker_id() : "";
  }

  // A worker the coordinator forgot registering again: its previous id and the run it has.
  v1::RegisterWorkerResponse Reregister(const std::string& previous_id, const std::string& job_id,
                                        int64_t generation, int32_t rank, bool finished = false) {
    v1::RegisterWorkerRequest request;
    // A name of its own: names are bound to live registrations.
    request.set_name(absl::StrCat("back-", ++reregistrations_));
    request.set_host("host-a");
    request.set_device_kind(v1::CPU);
    request.set_previous_worker_id(previous_id);
    request.mutable_status()->set_job_id(job_id);
    request.mutable_status()->set_generation(generation);
    request.mutable_status()->set_rank(rank);
    request.mutable_status()->set_step(5);
    request.mutable_status()->set_finished(finished);
    absl::StatusOr<v1::RegisterWorkerResponse> registered = manager_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.value_or(v1::RegisterWorkerResponse());
  }

  int reregistrations_ = 0;

  // Moves the clock to the end of the adoption window and ticks; `live` heartbeat first, so
  // their leases (shorter than the window) hold.
  void EndAdoptionWindow(const std::vector<std::string>& live = {}) {
    clock_.Advance(JobManagerOptions().AdoptionWindow());
    for (const std::string& worker_id : live) Beat(worker_id);
    manager_->Tick();
  }

  absl::StatusOr<v1::ReportProgressResponse> Report(const v1::Job& job, int rank, int64_t step) {
    v1::ReportProgressRequest request;
    request.set_worker_id(job.worker_ids(rank));
    request.set_job_id(job.id());
    request.set_generation(job.generation());
    request.set_rank(rank);
    request.mutable_metrics()->set_step(step);
    request.mutable_metrics()->set_loss(1.0 / static_cast<double>(step));
    return manager_->ReportProgress(request);
  }

  absl::Status Commit(const v1::Job& job, int rank, int64_t step) {
    return manager_->CommitCheckpoint(WrittenCommit(job, rank, step)).status();
  }

  absl::Status Finish(const v1::Job& job, int rank, bool finished = true) {
    v1::ReportProgressRequest request;
    request.set_worker_id(job.worker_ids(rank));
    request.set_job_id(job.id());
    request.set_generation(job.generation());
    request.set_rank(rank);
    request.mutable_metrics()->set_step(job.spec().steps());
    request.mutable_metrics()->set_loss(0.5);
    request.set_finished(finished);
    return manager_->ReportProgress(request).status();
  }

  // Makes the manager lose `worker_id`, which holds a rank of `job`'s current generation.
  void Lose(Loss loss, const std::string& worker_id, const v1::Job& job) {
    switch (loss) {
      case Loss::kLeft:
        ASSERT_TRUE(manager_->LeaveWorker(worker_id).ok());
        return;
      case Loss::kLeaseExpired:
        clock_.Advance(JobManagerOptions().lease.lease() + absl::Seconds(1));
        manager_->Tick();
        return;
      case Loss::kRunFailed: {
        v1::HeartbeatRequest request;
        request.set_worker_id(worker_id);
        request.mutable_status()->set_job_id(job.id());
        request.mutable_status()->set_generation(job.generation());
        request.mutable_status()->set_run_error("INTERNAL: the step failed");
        ASSERT_TRUE(manager_->Heartbeat(request).ok());
        return;
      }
    }
  }

  // A heartbeat of `worker_id`, which holds `rank` of `job`'s current generation, whose run
  // failed having seen `lost_ranks` die. Returns the assignment it gets back.
  v1::Assignment FailRun(const std::string& worker_id, const v1::Job& job, int rank,
                         const std::vector<int32_t>& lost_ranks) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.mutable_status()->set_job_id(job.id());
    request.mutable_status()->set_generation(job.generation());
    request.mutable_status()->set_rank(rank);
    request.mutable_status()->set_run_error("UNAVAILABLE: the collective failed");
    for (int32_t lost : lost_ranks) request.mutable_status()->add_lost_peer_ranks(lost);
    auto response = manager_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->assignment() : v1::Assignment();
  }

  // The job's whole event history.
  std::vector<v1::JobEvent> Events(const std::string& job_id) {
    auto sink = std::make_shared<RecordingSink>();
    EXPECT_TRUE(manager_->Watch(job_id, 0, sink).ok());
    return sink->events;
  }

  // The states the job went through, in order, from its STATE_CHANGED events.
  std::vector<v1::JobState> StatePath(const std::string& job_id) {
    std::vector<v1::JobState> path;
    for (const v1::JobEvent& event : Events(job_id)) {
      if (event.type() == v1::STATE_CHANGED) path.push_back(event.state());
    }
    return path;
  }

  common::FakeClock clock_;
  std::string dir_;
  std::string checkpoint_root_;       // <dir_>/checkpoints, the manager's checkpoint root
  bool with_checkpoint_root_ = true;  // whether Start() gives the manager checkpoint_root_
  std::optional<absl::Duration> regroup_wait_;  // the manager's, for the next Start()
  int64_t max_events_per_job_ = JobManagerOptions().max_events_per_job;  // likewise
  int64_t max_notices_per_generation_ = JobManagerOptions().max_notices_per_generation;
  std::unique_ptr<RendezvousStore> rendezvous_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerTest, JobWaitsForWorkersThenRunsAndSucceeds) {
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "job-000001");
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_EQ(job->spec().mode(), v1::ZERO2);  // defaults applied

  const std::string a = Register("a", "host-b");
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::PENDING);
  const std::string b = Register("b", "host-a");
  v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  EXPECT_EQ(running.generation(), 1);
  // Ranks are ordered by host: host-a's worker first.
  EXPECT_EQ(running.worker_ids(0), b);
  EXPECT_EQ(running.worker_ids(1), a);

  const v1::Assignment assignment = Beat(a);
  EXPECT_EQ(assignment.kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(assignment.rank(), 1);
  EXPECT_EQ(assignment.world_size(), 2);
  EXPECT_NE(assignment.plan_layout_hash(), 0u);
  EXPECT_EQ(assignment.spec().steps(), 10);

  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(job->id());
  plan_request.set_rank(1);
  auto plan = manager_->GetShardPlan(plan_request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layout_hash(), assignment.plan_layout_hash());
  plan_request.set_rank(2);
  EXPECT_EQ(manager_->GetShardPlan(plan_request).status().code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(Finish(running, 0).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(Finish(running, 1).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_EQ(manager_->GetJob(job->id())->progress().loss(), 0.5);

  // An ended job still shows its last generation's plan (recomputed from the spec): the same
  // layout and the same view of each rank as while it ran.
  plan_request.set_rank(1);
  plan_request.set_include_layout(true);
  auto ended = manager_->GetShardPlan(plan_request);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->layout_hash(), assignment.plan_layout_hash());
  EXPECT_EQ(ended->generation(), 1);
  EXPECT_EQ(ended->world_size(), 2);
  plan->set_generation(ended->generation());
  plan_request.set_include_layout(false);
  EXPECT_EQ(manager_->GetShardPlan(plan_request)->SerializeAsString(), plan->SerializeAsString());
  plan_request.set_rank(2);
  EXPECT_EQ(manager_->GetShardPlan(plan_request).status().code(),
            absl::StatusCode::kInvalidArgument);
  plan_request.set_rank(0);
  plan_request.set_generation(2);
  EXPECT_EQ(manager_->GetShardPlan(plan_request).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerTest, PendingJobHasNoPlan) {
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(job->id());
  const absl::Status refused = manager_->GetShardPlan(plan_request).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("has no running generation (PENDING)"), std::string::npos)
      << refused;
}

TEST_F(JobManagerTest, InvalidSpecIsRejectedAndNothingChanges) {
  v1::JobSpec spec = SeedSpec(1);
  spec.mutable_optimizer()->set_lr(-1);
  auto job = manager_->SubmitJob(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("optimizer.lr"), absl::string_view::npos);
  EXPECT_TRUE(manager_->ListJobs(v1::JOB_STATE_UNSPECIFIED, {}).items.empty());
  EXPECT_EQ(manager_->SubmitJob(SeedSpec(1))->id(), "job-000001");
}

TEST_F(JobManagerTest, LostWorkerEndsGenerationAndJobRestartsOnSurvivors) {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_workers(2);
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(spec);
  ASSERT_EQ(manager_->GetJob(job->id())->worker_ids_size(), 2);
  const v1::Job first = *manager_->GetJob(job->id());

  // Only a keeps beating; b's lease (3 s) ends.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat(a, job->id(), 1);
    manager_->Tick();
  }
  // a is told to abort generation 1; the job waits for it.
  v1::Job recovering = *manager_->GetJob(job->id());
  EXPECT_EQ(recovering.state(), v1::RECOVERING);
  EXPECT_NE(recovering.message().find("lease expired"), std::string::npos);
  // a acknowledges by no longer running generation 1; it becomes free and the job restarts.
  v1::Assignment abort = Beat(a, job->id(), 1);
  EXPECT_EQ(abort.kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_EQ(abort.generation(), 1);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_RUN);
  v1::Job second = *manager_->GetJob(job->id());
  EXPECT_EQ(second.state(), v1::RUNNING);
  EXPECT_EQ(second.generation(), 2);
  EXPECT_EQ(second.attempts(), 2);
  EXPECT_EQ(second.worker_ids_size(), 1);
  // The old generation's reports are refused with "stop".
  v1::ReportProgressRequest stale;
  stale.set_worker_id(first.worker_ids(0));
  stale.set_job_id(job->id());
  stale.set_generation(1);
  auto response = manager_->ReportProgress(stale);
  ASSERT_TRUE(response.ok());
  EXPECT_FALSE(response->continue_running());
}

TEST_F(JobManagerTest, RankProgressKeepsEachRanksLatestReportOfTheCurrentGeneration) {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_workers(2);
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto submitted = manager_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::Job first = *manager_->GetJob(submitted->id());
  ASSERT_EQ(first.worker_ids_size(), 2);
  // Sized to the world, empty until a rank reports.
  ASSERT_EQ(first.rank_progress_size(), 2);
  EXPECT_EQ(first.rank_progress(0).step(), 0);
  EXPECT_EQ(first.rank_progress(1).step(), 0);

  ASSERT_TRUE(Report(first, 1, 1).ok());
  ASSERT_TRUE(Report(first, 0, 1).ok());
  ASSERT_TRUE(Report(first, 0, 3).ok());
  v1::Job reported = *manager_->GetJob(first.id());
  EXPECT_EQ(reported.rank_progress(0).step(), 3);
  EXPECT_EQ(reported.rank_progress(1).step(), 1);
  EXPECT_DOUBLE_EQ(reported.rank_progress(1).loss(), 1.0);
  // A rank's step never goes back; the refused report changes nothing.
  EXPECT_EQ(Report(first, 0, 2).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->GetJob(first.id())->rank_progress(0).step(), 3);

  // b's lease ends: the next generation starts with empty entries for its one rank.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat(a, first.id(), 1);
    manager_->Tick();
  }
  Beat(a, first.id(), 1);
  ASSERT_EQ(Beat(a).kind(), v1::ASSIGNMENT_RUN);
  const v1::Job second = *manager_->GetJob(first.id());
  ASSERT_EQ(second.generation(), 2);
  ASSERT_EQ(second.rank_progress_size(), 1);
  EXPECT_EQ(second.rank_progress(0).step(), 0);
  ASSERT_TRUE(Report(second, 0, 2).ok());
  EXPECT_EQ(manager_->GetJob(first.id())->rank_progress(0).step(), 2);
}

TEST_F(JobManagerTest, JobFailsAfterMaxAttempts) {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_attempts(1);
  const std::string a = Register("a");
  auto job = manager_->SubmitJob(spec);
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(manager_->LeaveWorker(a).ok());
  v1::Job failed = *manager_->GetJob(job->id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_NE(failed.message().find("no attempts left"), std::string::npos);
}

TEST_F(JobManagerTest, CancelStopsWorkersAndFreesThemForTheNextJob) {
  const std::string a = Register("a");
  auto first = manager_->SubmitJob(SeedSpec(1));
  auto second = manager_->SubmitJob(SeedSpec(1));
  ASSERT_EQ(manager_->GetJob(first->id())->state(), v1::RUNNING);
  ASSERT_EQ(manager_->GetJob(second->id())->state(), v1::PENDING);
  auto cancelled = manager_->CancelJob(first->id(), "user asked");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->message(), "cancelled: user asked");
  EXPECT_EQ(Beat(a, first->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  const v1::Assignment next = Beat(a);
  EXPECT_EQ(next.kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(next.job_id(), second->id());
  EXPECT_EQ(manager_->CancelJob(first->id(), "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->CancelJob("job-000999", "").status().code(), absl::StatusCode::kNotFound);
}

// The thinning rule as docs/operations.md states it, applied to the events a live watcher saw,
// written `write_ends[i-1]` to `write_ends[i]` by one call each: whenever a write takes the job's
// stored events past the threshold (the limit; after a pass that left more than the limit, the
// count then plus a quarter of the limit), every second PROGRESS event among the oldest half of
// them is deleted. Returns the sequences that stay.
std::vector<int64_t> ThinnedAsDocumented(const std::vector<v1::JobEvent>& live,
                                         const std::vector<size_t>& write_ends, int64_t limit) {
  std::vector<std::pair<int64_t, v1::JobEventType>> kept;
  int64_t threshold = limit;
  size_t written = 0;
  for (const size_t write_end : write_ends) {
    for (; written < write_end; ++written) {
      kept.emplace_back(live[written].sequence(), live[written].type());
    }
    if (static_cast<int64_t>(kept.size()) <= threshold) continue;
    const size_t oldest_half = kept.size() / 2;
    std::vector<std::pair<int64_t, v1::JobEventType>> after_pass;
    int progress_seen = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      const bool doomed =
          i < oldest_half && kept[i].second == v1::PROGRESS && ++progress_seen % 2 == 0;
      if (!doomed) after_pass.push_back(kept[i]);
    }
    kept = std::move(after_pass);
    const int64_t count = static_cast<int64_t>(kept.size());
    threshold = count > limit ? count + limit / 4 : limit;
  }
  std::vector<int64_t> sequences;
  for (const auto& [sequence, type] : kept) sequences.push_back(sequence);
  return sequences;
}

std::vector<int64_t> SequencesOf(const std::vector<v1::JobEvent>& events) {
  std::vector<int64_t> sequences;
  for (const v1::JobEvent& event : events) sequences.push_back(event.sequence());
  return sequences;
}

TEST_F(JobManagerTest, PastTheLimitOldProgressEventsAreThinnedAndOtherEventsKept) {
  max_events_per_job_ = 40;
  StartFresh("thin");
  const std::string a = Register("a");
  v1::JobSpec spec = SeedSpec(1);
  spec.set_steps(100000);
  spec.set_max_attempts(3);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  // Follows from the start: it gets every event, thinned or not.
  auto live = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(job->id(), 0, live).ok());
  // Where each call's events end in `live`: a call's events are written together.
  std::vector<size_t> write_ends = {live->events.size()};
  int64_t step = 0;
  auto report_steps = [&](int count) {
    const v1::Job running = *manager_->GetJob(job->id());
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE(Report(running, 0, ++step).ok());
      write_ends.push_back(live->events.size());
    }
  };
  ASSERT_NO_FATAL_FAILURE(report_steps(100));
  // A failed run and the next generation put state events in the middle of the history.
  FailRun(a, *manager_->GetJob(job->id()), 0, {});
  write_ends.push_back(live->events.size());
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_RUN);
  write_ends.push_back(live->events.size());
  ASSERT_EQ(manager_->GetJob(job->id())->generation(), 2);
  ASSERT_NO_FATAL_FAILURE(report_steps(150));
  ASSERT_TRUE(manager_->CancelJob(job->id(), "enough").ok());
  write_ends.push_back(live->events.size());
  ASSERT_TRUE(live->ended);
  for (size_t i = 0; i < live->events.size(); ++i) {
    ASSERT_EQ(live->events[i].sequence(), static_cast<int64_t>(i) + 1);
  }

  const std::vector<v1::JobEvent> history = Events(job->id());
  EXPECT_EQ(SequencesOf(history),
            ThinnedAsDocumented(live->events, write_ends, max_events_per_job_));
  EXPECT_LT(history.size(), live->events.size());  // it was thinned
  EXPECT_LE(history.size(), static_cast<size_t>(max_events_per_job_));
  // Every event that is not PROGRESS survived.
  std::vector<int64_t> live_others;
  std::vector<int64_t> kept_others;
  for (const v1::JobEvent& event : live->events) {
    if (event.type() != v1::PROGRESS) live_others.push_back(event.sequence());
  }
  for (const v1::JobEvent& event : history) {
    if (event.type() != v1::PROGRESS) kept_others.push_back(event.sequence());
  }
  EXPECT_EQ(kept_others, live_others);
  EXPECT_GE(live_others.size(), 7u);  // PENDING, 2 generations started, RUNNING x2, RECOVERING,
                                      // CANCELLED
  // The newest events are never thinned: the job's last steps are all there.
  ASSERT_GE(history.size(), 2u);
  EXPECT_EQ(history[history.size() - 2].progress().step(), step);

  // A restarted coordinator reads the same thinned history.
  Start(dir_);
  EXPECT_EQ(SequencesOf(Events(job->id())), SequencesOf(history));
}

TEST_F(JobManagerTest, BelowTheLimitEveryEventIsKept) {
  max_events_per_job_ = 400;
  StartFresh("below");
  Register("a");
  v1::JobSpec spec = SeedSpec(1);
  spec.set_steps(100000);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  constexpr int64_t kSteps = 390;
  for (int64_t step = 1; step <= kSteps; ++step) ASSERT_TRUE(Report(running, 0, step).ok());
  const std::vector<v1::JobEvent> history = Events(job->id());
  // PENDING, generation started, RUNNING, then one PROGRESS per step.
  ASSERT_EQ(history.size(), static_cast<size_t>(3 + kSteps));
  for (size_t i = 0; i < history.size(); ++i) {
    ASSERT_EQ(history[i].sequence(), static_cast<int64_t>(i) + 1);
  }
}

TEST_F(JobManagerTest, WatchReplaysHistoryThenStreamsUntilTheEnd) {
  const std::string a = Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(job->id(), 0, sink).ok());
  const size_t replayed = sink->events.size();
  EXPECT_GE(replayed, 3u);  // submitted, generation started, running
  for (size_t i = 0; i < sink->events.size(); ++i) {
    EXPECT_EQ(sink->events[i].sequence(), static_cast<int64_t>(i + 1));
  }
  ASSERT_TRUE(Finish(*manager_->GetJob(job->id()), 0).ok());
  EXPECT_TRUE(sink->ended);
  EXPECT_EQ(sink->events.back().state(), v1::SUCCEEDED);
  EXPECT_EQ(sink->events[replayed].type(), v1::PROGRESS);

  auto late = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(job->id(), 2, late).ok());
  EXPECT_EQ(late->events.front().sequence(), 3);
  EXPECT_TRUE(late->ended);
  EXPECT_EQ(manager_->Watch("job-000404", 0, late).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, ClosedWatcherIsDropped) {
  Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(job->id(), 0, sink).ok());
  sink->open = false;
  const size_t seen = sink->events.size();
  ASSERT_TRUE(Finish(*manager_->GetJob(job->id()), 0, /*finished=*/false).ok());
  ASSERT_TRUE(Finish(*manager_->GetJob(job->id()), 0, /*finished=*/false).ok());
  EXPECT_EQ(sink->events.size(), seen + 1);  // the first event found it closed
  EXPECT_EQ(sink.use_count(), 1);
}

TEST_F(JobManagerTest, WatchersSeeOnlyDurableEvents) {
  Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(job->id(), 0, sink).ok());
  const size_t seen = sink->events.size();

  // Another connection holds the database: the manager's writes fail (SQLITE_BUSY).
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/zeroshard.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE;", nullptr, nullptr, nullptr), SQLITE_OK);
  ASSERT_TRUE(Report(running, 0, 1).ok());  // accepted; memory stays authoritative
  EXPECT_EQ(manager_->GetJob(job->id())->progress().step(), 1);
  // A restart could lose the event and give its sequence to another: nobody sees it yet.
  EXPECT_EQ(sink->events.size(), seen);
  EXPECT_EQ(Events(job->id()).size(), seen);
  ASSERT_EQ(sqlite3_exec(db, "COMMIT;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  // The next write makes both durable, and both are sent, in order.
  ASSERT_TRUE(Report(running, 0, 2).ok());
  ASSERT_EQ(sink->events.size(), seen + 2);
  EXPECT_EQ(sink->events[seen].progress().step(), 1);
  EXPECT_EQ(sink->events[seen + 1].progress().step(), 2);
  EXPECT_EQ(Events(job->id()).size(), seen + 2);
}

TEST_F(JobManagerTest, RestartKeepsJobsAndRestartsRunningOnesInANewGeneration) {
  Register("a");
  auto running = manager_->SubmitJob(SeedSpec(1));
  auto pending = manager_->SubmitJob(SeedSpec(1));
  const int64_t events_before = manager_->GetJob(running->id())->generation();
  ASSERT_EQ(events_before, 1);

  Start(dir_);  // a new manager on the same state dir; workers are soft state
  EXPECT_TRUE(manager_->ListWorkers(v1::WORKER_STATE_UNSPECIFIED).empty());
  // The running job waits for its worker to come back and be adopted; none does.
  EXPECT_EQ(manager_->GetJob(running->id())->state(), v1::RUNNING);
  EndAdoptionWindow();
  v1::Job recovered = *manager_->GetJob(running->id());
  EXPECT_EQ(recovered.state(), v1::RECOVERING);
  EXPECT_NE(recovered.message().find("coordinator restarted: ranks 0 did not come back"),
            std::string::npos)
      << recovered.message();
  EXPECT_EQ(manager_->GetJob(pending->id())->state(), v1::PENDING);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(running->id(), 0, sink).ok());
  EXPECT_EQ(sink->events.front().message(), "submitted");
  EXPECT_EQ(sink->events.back().state(), v1::RECOVERING);

  // New ids continue after the stored ones; re-registered workers pick the job up again.
  EXPECT_EQ(manager_->SubmitJob(SeedSpec(1))->id(), "job-000003");
  const std::string b = Register("b");
  EXPECT_EQ(Beat(b).job_id(), running->id());
  EXPECT_EQ(manager_->GetJob(running->id())->generation(), 2);
}

// A job that needs more workers than are live says so at the end of its message, once (also
// after a restart), and the message is what it was before once enough workers are live.
TEST_F(JobManagerTest, AnUnschedulableJobsMessageSaysWhyUntilItFits) {
  Register("a");
  auto running = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(manager_->GetJob(running->id())->state(), v1::RUNNING);
  auto waiting = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_TRUE(absl::StartsWith(manager_->GetJob(waiting->id())->message(),
                               "unschedulable: needs 2 CPU workers and the cluster has 1 live"))
      << manager_->GetJob(waiting->id())->message();

  // The stored message carries the old reason; the new one replaces it.
  Start(dir_);
  manager_->Tick();
  const std::string after_restart = manager_->GetJob(waiting->id())->message();
  EXPECT_TRUE(absl::StartsWith(after_restart,
                               "unschedulable: needs 2 CPU workers and the cluster has 0 live"))
      << after_restart;
  EXPECT_EQ(after_restart.find("unschedulable", 1), std::string::npos) << after_restart;

  // A RECOVERING job keeps why its generation ended before the reason.
  EndAdoptionWindow();
  const v1::Job recovering = *manager_->GetJob(running->id());
  ASSERT_EQ(recovering.state(), v1::RECOVERING);
  const size_t reason = recovering.message().find("; unschedulable: needs 1 CPU workers");
  ASSERT_NE(reason, std::string::npos) << recovering.message();
  EXPECT_TRUE(absl::StartsWith(recovering.message(), "generation 1 ended: coordinator restarted"))
      << recovering.message();

  // Two workers: the recovering job starts on one, the other job fits the cluster and waits for
  // the second worker to be idle, its message empty again as at submission.
  Register("b");
  Register("c");
  EXPECT_EQ(manager_->GetJob(running->id())->state(), v1::RUNNING);
  const v1::Job fits = *manager_->GetJob(waiting->id());
  EXPECT_EQ(fits.state(), v1::PENDING);
  EXPECT_EQ(fits.message(), "");
}

TEST_F(JobManagerTest, UnknownWorkerHeartbeatIsNotFound) {
  v1::HeartbeatRequest request;
  request.set_worker_id("worker-000123");
  EXPECT_EQ(manager_->Heartbeat(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, CheckpointBecomesLatestWhenEveryRankCommitted) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  const v1::Job running = *manager_->GetJob(job->id());
  const std::string step_dir =
      checkpoint::StepDir(checkpoint::JobCheckpointDir(checkpoint_root_, job->id()), 5);
  v1::CommitCheckpointRequest commit;
  for (int rank : {1, 0}) {
    // The manifest is written last: not before every rank committed.
    EXPECT_FALSE(std::filesystem::exists(checkpoint::ManifestPath(step_dir)));
    commit = WrittenCommit(running, rank, 5);
    auto response = manager_->CommitCheckpoint(commit);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->complete(), rank == 0);
  }
  const v1::CheckpointRecord latest = manager_->GetJob(job->id())->latest_checkpoint();
  EXPECT_EQ(latest.step(), 5);
  EXPECT_EQ(latest.manifest_path(), job->id() + "/step-000000000005/manifest.json");
  absl::StatusOr<checkpoint::CommittedCheckpoint> committed = checkpoint::OpenCommittedCheckpoint(
      *checkpoint::Directory::OpenRoot(checkpoint_root_), job->id(), 5, job->id());
  ASSERT_TRUE(committed.ok()) << committed.status();
  const v1::CheckpointManifest* manifest = &committed->manifest;
  EXPECT_EQ(manifest->world_size(), 2);
  ASSERT_EQ(manifest->files_size(), 2);
  EXPECT_EQ(manifest->files(1).path(), "rank-00001-of-00002.safetensors");
  commit.set_worker_id(running.worker_ids(1));  // rank 0 claimed by the wrong worker
  EXPECT_EQ(manager_->CommitCheckpoint(commit).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(JobManagerTest, RepeatedOrLateCheckpointCommitNeverMovesLatestBack) {
  Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  const v1::Job running = *manager_->GetJob(job->id());
  auto commit = [&](int64_t step) {
    return manager_->CommitCheckpoint(WrittenCommit(running, 0, step));
  };
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(manager_->Watch(job->id(), 0, sink).ok());
  auto count_checkpoint_events = [&] {
    return std::count_if(sink->events.begin(), sink->events.end(), [](const v1::JobEvent& e) {
      return e.type() == v1::CHECKPOINT_COMMITTED;
    });
  };
  ASSERT_TRUE(commit(5).ok());
  auto latest = commit(10);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(count_checkpoint_events(), 2);

  auto repeated = commit(10);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_TRUE(repeated->complete());
  EXPECT_EQ(repeated->checkpoint().SerializeAsString(), latest->checkpoint().SerializeAsString());
  auto late = commit(5);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->complete());
  EXPECT_FALSE(late->has_checkpoint());
  EXPECT_EQ(count_checkpoint_events(), 2);
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 10);
}

TEST_F(JobManagerTest, CommitsNameTheirFileAndOnlyKeepCheckpointsSurvive) {
  Register("a");
  v1::JobSpec spec = SeedSpec(1);
  spec.mutable_checkpoint()->set_keep(2);
  auto job = manager_->SubmitJob(spec);
  const v1::Job running = *manager_->GetJob(job->id());
  v1::CommitCheckpointRequest misnamed = WrittenCommit(running, 0, 3);
  misnamed.set_path(job->id() + "/step-3/rank-0");
  const absl::Status refused = manager_->CommitCheckpoint(misnamed).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(refused.message(), "path: ")) << refused;
  for (int64_t step : {5, 10, 15}) {
    auto response = manager_->CommitCheckpoint(WrittenCommit(running, 0, step));
    ASSERT_TRUE(response.ok()) << response.status();
    ASSERT_TRUE(response->complete());
  }
  absl::StatusOr<checkpoint::CheckpointListing> listing = checkpoint::ListCheckpoints(
      *checkpoint::Directory::OpenRoot(checkpoint_root_), job->id(), job->id());
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->committed.size(), 2u);
  EXPECT_EQ(listing->committed[0].step, 15);
  EXPECT_EQ(listing->committed[1].step, 10);
  EXPECT_TRUE(listing->uncommitted.empty());  // step 3's file went with the pruning
}

// Issue 24's audit, through the coordinator: step-* links planted in a job's directory point at a
// directory outside the checkpoint root holding 5 files. The job commits checkpoints (keep 1):
// the coordinator used to delete all 5 files while pruning (this test fails on that code). Now
// the links are left, a NOTICE names them, and the 5 files are still there.
TEST_F(JobManagerTest, StepLinksInAJobDirectoryMakeTheCoordinatorDeleteNothingOutsideTheRoot) {
  Register("a");
  v1::JobSpec spec = SeedSpec(1);
  spec.mutable_checkpoint()->set_keep(1);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  const std::string outside = dir_ + "/outside";
  ASSERT_TRUE(std::filesystem::create_directories(outside));
  for (int i = 0; i < 5; ++i) std::ofstream(absl::StrCat(outside, "/file-", i)) << "precious";
  const std::string job_dir = checkpoint::JobCheckpointDir(checkpoint_root_, job->id());
  std::filesystem::create_directories(job_dir);
  for (int64_t step : {3, 5, 7}) {
    std::filesystem::create_directory_symlink(outside, checkpoint::StepDir(job_dir, step));
  }
  for (int64_t step : {2, 4, 6, 8}) {
    absl::StatusOr<v1::CommitCheckpointResponse> response =
        manager_->CommitCheckpoint(WrittenCommit(running, 0, step));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->complete()) << step;
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(outside),
                          std::filesystem::directory_iterator()),
            5);
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 8);
  std::vector<std::string> notices;
  for (const v1::JobEvent& event : Events(job->id())) {
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  ASSERT_FALSE(notices.empty());
  EXPECT_TRUE(absl::StrContains(
      notices.back(), "3 step entries refused and left alone: " + checkpoint::StepDir(job_dir, 7) +
                          " is a symbolic link"))
      << notices.back();
}

// Issue 24: a worker plants a sparse 20 GB manifest.json where the coordinator will commit.
// Before, the commit renamed its manifest over it; a reader meeting such a file read it whole.
// Now the commit fails, with a NOTICE naming the file, its size and the cap, at bounded cost
// (the file is never read), and the job's later checkpoints commit as usual.
TEST_F(JobManagerTest, ACommitMeetingASparse20GbManifestFailsWithANotice) {
  Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  const v1::CommitCheckpointRequest commit = WrittenCommit(running, 0, 4);
  const std::string manifest_path = checkpoint::ManifestPath(
      checkpoint::StepDir(checkpoint::JobCheckpointDir(checkpoint_root_, job->id()), 4));
  constexpr int64_t kHuge = int64_t{20} << 30;
  const int fd = ::open(manifest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kHuge), 0);
  ::close(fd);

  struct rusage before;
  ::getrusage(RUSAGE_SELF, &before);
  absl::StatusOr<v1::CommitCheckpointResponse> response = manager_->CommitCheckpoint(commit);
  struct rusage after;
  ::getrusage(RUSAGE_SELF, &after);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_FALSE(response->complete());
  EXPECT_LT((after.ru_maxrss - before.ru_maxrss) * 1024,
            static_cast<long>(checkpoint::kMaxManifestBytes));
  EXPECT_FALSE(manager_->GetJob(job->id())->has_latest_checkpoint());
  std::vector<std::string> notices;
  for (const v1::JobEvent& event : Events(job->id())) {
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(absl::StrContains(notices[0], "checkpoint at step 4 could not be committed"))
      << notices[0];
  EXPECT_TRUE(absl::StrContains(
      notices[0], absl::StrCat(manifest_path, " holds ", kHuge, " bytes, more than the ",
                               checkpoint::kMaxManifestBytes)))
      << notices[0];
  EXPECT_EQ(std::filesystem::file_size(manifest_path), static_cast<uintmax_t>(kHuge));

  absl::StatusOr<v1::CommitCheckpointResponse> later =
      manager_->CommitCheckpoint(WrittenCommit(running, 0, 6));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_TRUE(later->complete());
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 6);
}

// Issue 25, item 8: trainers found their job by name, which anyone may reuse. A run key is an
// exact lookup scoped to its submitter: another submitter's job with the same key (or name) is
// never found, a second job of the same submitter with the key is ALREADY_EXISTS, and the index
// survives a coordinator restart.
TEST_F(JobManagerTest, ARunKeyFindsOnlyItsSubmittersJob) {
  Register("a");
  v1::JobSpec spec = SeedSpec(1);
  spec.set_run_key("3f9a-1");
  absl::StatusOr<v1::Job> mine = manager_->SubmitJob(spec, "alice", false);
  ASSERT_TRUE(mine.ok()) << mine.status();
  absl::StatusOr<v1::Job> theirs = manager_->SubmitJob(spec, "mallory", false);
  ASSERT_TRUE(theirs.ok()) << theirs.status();  // a key of its own submitter: no clash
  const absl::Status again = manager_->SubmitJob(spec, "alice", false).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_TRUE(absl::StartsWith(again.message(), "run_key: ")) << again;
  spec.set_run_key("Not_A_Key");
  EXPECT_EQ(manager_->SubmitJob(spec, "alice", false).status().code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(manager_->FindJobByRunKey("alice", "3f9a-1")->id(), mine->id());
  EXPECT_EQ(manager_->FindJobByRunKey("mallory", "3f9a-1")->id(), theirs->id());
  EXPECT_EQ(manager_->FindJobByRunKey("bob", "3f9a-1").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->FindJobByRunKey("alice", "3f9a-2").status().code(),
            absl::StatusCode::kNotFound);
  Start(dir_);  // a coordinator restart on the same state
  EXPECT_EQ(manager_->FindJobByRunKey("alice", "3f9a-1")->id(), mine->id());
  EXPECT_EQ(manager_->FindJobByRunKey("mallory", "3f9a-1")->id(), theirs->id());
}

TEST_F(JobManagerTest, ANoticeFromAnyRankBecomesAnEvent) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  const v1::Job running = *manager_->GetJob(job->id());
  v1::ReportProgressRequest request;
  request.set_worker_id(running.worker_ids(1));
  request.set_job_id(job->id());
  request.set_generation(1);
  request.set_rank(1);
  request.mutable_metrics()->set_step(3);
  request.set_notice("checkpoint at step 3 unusable");
  ASSERT_TRUE(manager_->ReportProgress(request).ok());
  std::vector<std::string> notices;
  for (const v1::JobEvent& event : Events(job->id())) {
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  EXPECT_EQ(notices, std::vector<std::string>({"rank 1: checkpoint at step 3 unusable"}));
  EXPECT_FALSE(manager_->GetJob(job->id())->has_progress());  // only rank 0's steps count
}

TEST_F(JobManagerTest, WithoutACheckpointRootNothingIsCommitted) {
  with_checkpoint_root_ = false;
  StartFresh("no-root");
  Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  const absl::Status refused =
      manager_->CommitCheckpoint(WrittenCommit(*manager_->GetJob(job->id()), 0, 2)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(refused.message(), "checkpoint_root: ")) << refused;
  EXPECT_FALSE(manager_->GetJob(job->id())->has_latest_checkpoint());
  const absl::Status no_export = manager_->FindExportCheckpoint(job->id(), 2).status();
  EXPECT_EQ(no_export.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_export.message(), "--checkpoint_root")) << no_export;
}

TEST_F(JobManagerTest, ExportFindsTheFinalCheckpointOrACommittedStep) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  const v1::Job running = *manager_->GetJob(job->id());
  for (int64_t step : {5, 10}) {
    for (int rank : {0, 1}) {
      ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(running, rank, step)).ok());
    }
  }
  const std::string job_dir = checkpoint::JobCheckpointDir(checkpoint_root_, job->id());

  // Running, the job has no final state, even with a checkpoint at its last step.
  absl::Status refused = manager_->FindExportCheckpoint(job->id(), std::nullopt).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(refused.message(), "job_id: ")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "it is RUNNING")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "committed steps: 5, 10")) << refused;
  absl::StatusOr<ExportSource> step5 = manager_->FindExportCheckpoint(job->id(), 5);
  ASSERT_TRUE(step5.ok()) << step5.status();
  EXPECT_EQ(step5->checkpoint.step, 5);
  EXPECT_EQ(step5->checkpoint.directory, checkpoint::StepDir(job_dir, 5));
  EXPECT_EQ(step5->checkpoint.manifest.world_size(), 2);
  EXPECT_FALSE(step5->is_final);

  ASSERT_TRUE(Finish(running, 0).ok());
  ASSERT_TRUE(Finish(running, 1).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
  for (std::optional<int64_t> step : {std::optional<int64_t>(), std::optional<int64_t>(10)}) {
    absl::StatusOr<ExportSource> final_state = manager_->FindExportCheckpoint(job->id(), step);
    ASSERT_TRUE(final_state.ok()) << final_state.status();
    EXPECT_EQ(final_state->checkpoint.step, 10);
    EXPECT_TRUE(final_state->is_final);
  }
  step5 = manager_->FindExportCheckpoint(job->id(), 5);
  ASSERT_TRUE(step5.ok()) << step5.status();
  EXPECT_FALSE(step5->is_final);

  const absl::Status uncommitted = manager_->FindExportCheckpoint(job->id(), 7).status();
  EXPECT_EQ(uncommitted.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(uncommitted.message(), "step: ")) << uncommitted;
  EXPECT_TRUE(absl::StrContains(uncommitted.message(), "committed steps: 5, 10")) << uncommitted;
  EXPECT_EQ(manager_->FindExportCheckpoint("job-999999", std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, AJobThatSucceededWithoutACheckpointAtItsLastStepHasNoFinalState) {
  Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(running, 0, 5)).ok());
  ASSERT_TRUE(Finish(running, 0).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
  const absl::Status refused = manager_->FindExportCheckpoint(job->id(), std::nullopt).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "latest checkpoint at step 5")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "committed steps: 5 ")) << refused;
  EXPECT_TRUE(manager_->FindExportCheckpoint(job->id(), 5).ok());
}

TEST_F(JobManagerTest, TheNextGenerationResumesFromTheLatestCheckpoint) {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_workers(2);
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(spec);
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(first.worker_ids_size(), 2);
  EXPECT_FALSE(Beat(a).has_resume_from());  // the first generation starts from scratch
  for (int rank : {0, 1}) {
    ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(first, rank, 7)).ok());
  }
  Lose(Loss::kLeft, b, first);
  EXPECT_EQ(Beat(a, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  const v1::Assignment second = Beat(a);
  ASSERT_EQ(second.kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(second.generation(), 2);
  EXPECT_EQ(second.world_size(), 1);
  EXPECT_EQ(second.start_step(), 7);
  EXPECT_EQ(second.resume_from().step(), 7);
  EXPECT_EQ(second.resume_from().generation(), 1);
  EXPECT_EQ(second.resume_from().world_size(), 2);
}

// Issue 38, row 6: JobSpec.resume_from starts a job (of any mode) from another job's committed
// checkpoint until it commits one of its own; everything that would not load, or load something
// else, is refused at submission naming the field. Fails before the fix: no such field.
TEST_F(JobManagerTest, ResumeFromStartsAJobFromAnotherJobsCheckpoint) {
  const std::string a = Register("a");
  v1::JobSpec source_spec = SeedSpec(1);
  source_spec.mutable_checkpoint()->set_every_steps(5);
  auto source = manager_->SubmitJob(source_spec, "alice", /*may_name_any_job=*/false);
  ASSERT_TRUE(source.ok()) << source.status();
  const v1::Job running = *manager_->GetJob(source->id());
  ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(running, 0, 5)).ok());

  v1::JobSpec spec = SeedSpec(1);
  spec.set_mode(v1::ZERO3);
  spec.mutable_resume_from()->set_job_id(source->id());
  auto refuse = [&](const v1::JobSpec& refused_spec, const std::string& submitter,
                    absl::StatusCode code, absl::string_view starts) {
    const absl::Status refused =
        manager_->SubmitJob(refused_spec, submitter, /*may_name_any_job=*/false).status();
    EXPECT_EQ(refused.code(), code) << refused;
    EXPECT_TRUE(absl::StartsWith(refused.message(), starts)) << refused;
  };
  // Running: it still prunes its checkpoints.
  refuse(spec, "alice", absl::StatusCode::kFailedPrecondition, "resume_from.job_id: ");
  ASSERT_TRUE(Finish(running, 0).ok());
  ASSERT_EQ(manager_->GetJob(source->id())->state(), v1::SUCCEEDED);

  v1::JobSpec no_job = spec;
  no_job.mutable_resume_from()->set_job_id("job-000099");
  refuse(no_job, "alice", absl::StatusCode::kNotFound, "resume_from.job_id: ");
  refuse(spec, "mallory", absl::StatusCode::kPermissionDenied, "resume_from.job_id: ");
  v1::JobSpec other_model = spec;
  other_model.mutable_workload()->set_preset("medium");
  refuse(other_model, "alice", absl::StatusCode::kFailedPrecondition, "workload: ");
  v1::JobSpec other_optimizer = spec;
  other_optimizer.mutable_optimizer()->set_kind(v1::ADAMW);
  refuse(other_optimizer, "alice", absl::StatusCode::kFailedPrecondition, "optimizer.kind: ");
  v1::JobSpec other_dtype = spec;
  other_dtype.mutable_precision()->set_param_dtype(v1::BFLOAT16);
  other_dtype.mutable_precision()->set_master_dtype(v1::FLOAT32);
  refuse(other_dtype, "alice", absl::StatusCode::kFailedPrecondition, "precision.param_dtype: ");
  v1::JobSpec no_step = spec;
  no_step.mutable_resume_from()->set_step(4);
  refuse(no_step, "alice", absl::StatusCode::kNotFound, "resume_from.step: ");
  v1::JobSpec too_few_steps = spec;
  too_few_steps.set_steps(5);
  refuse(too_few_steps, "alice", absl::StatusCode::kInvalidArgument, "steps: ");
  v1::JobSpec step_zero = spec;
  step_zero.mutable_resume_from()->set_step(0);
  refuse(step_zero, "alice", absl::StatusCode::kInvalidArgument, "resume_from.step: ");
  EXPECT_EQ(manager_->ListJobs(v1::JOB_STATE_UNSPECIFIED, PageRequest{}).items.size(), 1u)
      << "a refused job was created";

  // The latest committed checkpoint by default; an admin may name anyone's job.
  auto job = manager_->SubmitJob(spec, "root", /*may_name_any_job=*/true);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->resumed_from().job_id(), source->id());
  EXPECT_EQ(job->resumed_from().step(), 5);
  EXPECT_EQ(job->resumed_from().manifest_path(),
            absl::StrCat(source->id(), "/step-000000000005/manifest.json"));
  const v1::Assignment first = Beat(a);
  ASSERT_EQ(first.kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(first.job_id(), job->id());
  EXPECT_EQ(first.start_step(), 5);
  EXPECT_EQ(first.resume_from().job_id(), source->id());
  EXPECT_EQ(first.resume_from().manifest_path(), job->resumed_from().manifest_path());
  // Once it commits its own, a recovery resumes from that.
  const v1::Job resumed = *manager_->GetJob(job->id());
  ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(resumed, 0, 7)).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 7);
  EXPECT_TRUE(manager_->GetJob(job->id())->latest_checkpoint().job_id().empty());
}

TEST_F(JobManagerTest, AGenerationResumedAtTheLastStepFinishesWithoutAStepOfItsOwn) {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_workers(2);
  spec.set_steps(7);
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(spec);
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(first.worker_ids_size(), 2);
  for (int rank : {0, 1}) {
    ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(first, rank, 7)).ok());
  }
  Lose(Loss::kLeft, b, first);
  EXPECT_EQ(Beat(a, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  ASSERT_EQ(Beat(a).start_step(), 7);
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.generation(), 2);
  // The rank resumed at step 7 of 7 runs no step: its finish carries empty metrics.
  v1::ReportProgressRequest finished;
  finished.set_worker_id(a);
  finished.set_job_id(job->id());
  finished.set_generation(2);
  finished.set_rank(0);
  finished.mutable_metrics();
  finished.set_finished(true);
  ASSERT_TRUE(manager_->ReportProgress(finished).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
}

TEST_F(JobManagerTest, SkippedAndFailedCheckpointsAreNoticesAndNeverComplete) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_TRUE(manager_->CommitCheckpoint(WrittenCommit(running, 0, 4)).ok());
  v1::CommitCheckpointRequest commit = WrittenCommit(running, 1, 4);
  commit.set_outcome(v1::CHECKPOINT_FAILED);
  commit.set_message("RESOURCE_EXHAUSTED: No space left on device");
  auto failed = manager_->CommitCheckpoint(commit);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_FALSE(failed->complete());
  commit.set_step(6);
  commit.set_outcome(v1::CHECKPOINT_SKIPPED);
  commit.set_message("the checkpoint of step 4 was still being written");
  ASSERT_TRUE(manager_->CommitCheckpoint(commit).ok());
  EXPECT_FALSE(manager_->GetJob(job->id())->has_latest_checkpoint());
  std::vector<std::string> notices;
  for (const v1::JobEvent& event : Events(job->id())) {
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  ASSERT_EQ(notices.size(), 2u);
  EXPECT_EQ(notices[0],
            "checkpoint at step 4 failed on rank 1: RESOURCE_EXHAUSTED: No space left on device");
  EXPECT_EQ(notices[1],
            "checkpoint at step 6 skipped on rank 1: the checkpoint of step 4 was still being "
            "written");
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
}

TEST_F(JobManagerTest, JobsPastTheSixDigitIdsStayInSubmissionOrder) {
  std::filesystem::remove_all(dir_ + "-many");
  {
    auto store = JobStore::Open(dir_ + "-many");
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job older, newer;
    older.set_id("job-999999");
    older.set_state(v1::SUCCEEDED);
    newer.set_id("job-1000000");
    newer.set_state(v1::SUCCEEDED);
    const v1::Job* jobs[] = {&older, &newer};
    ASSERT_TRUE((*store)->Save(jobs, {}).ok());
  }
  Start(dir_ + "-many");
  auto submitted = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->id(), "job-1000001");
  std::vector<std::string> newest_first;
  for (const v1::Job& job : manager_->ListJobs(v1::JOB_STATE_UNSPECIFIED, {}).items) {
    newest_first.push_back(job.id());
  }
  EXPECT_EQ(newest_first, (std::vector<std::string>{"job-1000001", "job-1000000", "job-999999"}));
}

TEST_F(JobManagerTest, ListJobsPagesNewestFirstAcrossTheSixDigitIds) {
  std::filesystem::remove_all(dir_ + "-paged");
  {
    auto store = JobStore::Open(dir_ + "-paged");
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job older, newer;
    older.set_id("job-999999");
    older.set_state(v1::SUCCEEDED);
    newer.set_id("job-1000000");
    newer.set_state(v1::FAILED);
    const v1::Job* jobs[] = {&older, &newer};
    ASSERT_TRUE((*store)->Save(jobs, {}).ok());
  }
  Start(dir_ + "-paged");
  ASSERT_TRUE(manager_->SubmitJob(SeedSpec(1)).ok());
  std::vector<std::string> newest_first;
  PageRequest page;
  page.max_items = 1;
  for (int pages = 1;; ++pages) {
    ASSERT_LE(pages, 3);
    Page<v1::Job> jobs = manager_->ListJobs(v1::JOB_STATE_UNSPECIFIED, page);
    ASSERT_EQ(jobs.items.size(), 1u);
    newest_first.push_back(jobs.items[0].id());
    if (!jobs.next_after.has_value()) break;
    page.after = jobs.next_after;
  }
  EXPECT_EQ(newest_first, (std::vector<std::string>{"job-1000001", "job-1000000", "job-999999"}));
  // A state filter skips the others; the last matching job ends the listing.
  PageRequest first;
  first.max_items = 1;
  Page<v1::Job> succeeded = manager_->ListJobs(v1::SUCCEEDED, first);
  ASSERT_EQ(succeeded.items.size(), 1u);
  EXPECT_EQ(succeeded.items[0].id(), "job-999999");
  EXPECT_FALSE(succeeded.next_after.has_value());
}

TEST_F(JobManagerTest, ListWorkersPagesEndBeforeTheirByteBound) {
  std::vector<std::string> registered;
  for (const char* name : {"a", "b", "c", "d", "e"}) registered.push_back(Register(name));
  PageRequest page;
  page.max_bytes = 1;  // smaller than any worker: one worker a page
  std::vector<std::string> listed;
  for (int pages = 1;; ++pages) {
    ASSERT_LE(pages, 5);
    Page<v1::WorkerInfo> workers = manager_->ListWorkersPage(v1::WORKER_STATE_UNSPECIFIED, page);
    ASSERT_EQ(workers.items.size(), 1u);
    listed.push_back(workers.items[0].id());
    if (!workers.next_after.has_value()) break;
    page.after = workers.next_after;
  }
  EXPECT_EQ(listed, registered);
  // Two and a half times one worker's size holds two of them with their framing, not three
  // (same-length names and hosts: equal sizes).
  const size_t size = manager_->ListWorkers(v1::IDLE)[0].ByteSizeLong();
  PageRequest two;
  two.max_bytes = 2 * size + size / 2;
  Page<v1::WorkerInfo> first = manager_->ListWorkersPage(v1::IDLE, two);
  EXPECT_EQ(first.items.size(), 2u);
  EXPECT_TRUE(first.next_after.has_value());
}

TEST_F(JobManagerTest, FailedRunEndsItsGenerationAndTheJobRestarts) {
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  // b's run failed (say its communicator could not be built); a is still in the generation.
  v1::HeartbeatRequest failed;
  failed.set_worker_id(b);
  failed.mutable_status()->set_job_id(job->id());
  failed.mutable_status()->set_generation(1);
  failed.mutable_status()->set_run_error("UNAVAILABLE: rendezvous timed out");
  auto response = manager_->Heartbeat(failed);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->assignment().kind(), v1::ASSIGNMENT_ABORT);
  v1::Job recovering = *manager_->GetJob(job->id());
  EXPECT_EQ(recovering.state(), v1::RECOVERING);
  EXPECT_NE(recovering.message().find("rendezvous timed out"), std::string::npos);
  // Both acknowledge by no longer running generation 1; the job runs again as generation 2.
  Beat(a);
  EXPECT_EQ(Beat(b).kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(manager_->GetJob(job->id())->generation(), 2);
  // An error about a generation that is not the worker's current one changes nothing.
  failed.mutable_status()->set_generation(1);
  ASSERT_TRUE(manager_->Heartbeat(failed).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
}

// ---- Regrouping after a lost worker (job_manager.h, "Regrouping") ----

// Any W from 1 to 4 divides the global batch: the scheduler would start on the first worker back.
v1::JobSpec ElasticSpec() {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_workers(4);
  spec.set_global_batch(12);
  spec.set_max_attempts(5);
  return spec;
}

std::vector<std::string> WorkerIds(const v1::Job& job) {
  return {job.worker_ids().begin(), job.worker_ids().end()};
}

std::vector<std::string> NoticesOf(const std::vector<v1::JobEvent>& events) {
  std::vector<std::string> notices;
  for (const v1::JobEvent& event : events) {
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  return notices;
}

TEST_F(JobManagerTest, TheNextGenerationWaitsForEverySurvivorThenAddsSparesUpToMax) {
  const std::string a = Register("a");
  const std::string b = Register("b");
  const std::string c = Register("c");
  const std::string d = Register("d");
  auto job = manager_->SubmitJob(ElasticSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(WorkerIds(first), (std::vector<std::string>{a, b, c, d}));
  // Spares registered while generation 1 runs stay idle.
  const std::string e = Register("e");
  const std::string f = Register("f");

  // c is killed: every survivor's run fails naming rank 2, and each comes back on its own.
  EXPECT_EQ(FailRun(a, first, 0, {2}).kind(), v1::ASSIGNMENT_ABORT);
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  EXPECT_EQ(FailRun(d, first, 3, {2}).kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_IDLE);  // back, and idle spares exist: still waiting
  manager_->Tick();
  EXPECT_EQ(Beat(d).kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING) << "b is not back yet";
  EXPECT_EQ(FailRun(b, first, 1, {2}).kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  EXPECT_EQ(Beat(b).kind(), v1::ASSIGNMENT_RUN);

  // All three survivors, and one spare up to max_workers 4 (the first one, e).
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.state(), v1::RUNNING);
  EXPECT_EQ(second.generation(), 2);
  EXPECT_EQ(WorkerIds(second), (std::vector<std::string>{a, b, d, e}));
  EXPECT_EQ(Beat(f).kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_TRUE(NoticesOf(Events(job->id())).empty());
}

TEST_F(JobManagerTest, AMemberNamedLostIsNotWaitedFor) {
  // A long wait, so that only the reports can end it early.
  regroup_wait_ = absl::Minutes(1);
  StartFresh("long-wait");
  const std::string a = Register("a");
  const std::string b = Register("b");
  const std::string c = Register("c");
  auto job = manager_->SubmitJob(ElasticSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(WorkerIds(first), (std::vector<std::string>{a, b, c}));
  const std::string spare = Register("spare");

  // a's run fails without naming anyone: c, silent but with its lease running, is awaited.
  EXPECT_EQ(FailRun(a, first, 0, {}).kind(), v1::ASSIGNMENT_ABORT);
  Beat(a);
  EXPECT_EQ(FailRun(b, first, 1, {}).kind(), v1::ASSIGNMENT_ABORT);
  Beat(b);
  manager_->Tick();
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  // Reports naming c from a worker that is not the rank it claims, and about another
  // generation, change nothing.
  v1::Job stale = first;
  stale.set_generation(7);
  FailRun(spare, first, 0, {2});
  FailRun(a, stale, 0, {2});
  manager_->Tick();
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  // b's report, late, names rank 2: c is not waited for any more.
  FailRun(b, first, 1, {2});
  manager_->Tick();
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.state(), v1::RUNNING);
  EXPECT_EQ(WorkerIds(second), (std::vector<std::string>{a, b, spare}));
  EXPECT_TRUE(NoticesOf(Events(job->id())).empty());
}

TEST_F(JobManagerTest, TheRegroupWaitEndsWhenASurvivorDoesNotComeBack) {
  const std::string a = Register("a");
  const std::string b = Register("b");
  const std::string c = Register("c");
  auto job = manager_->SubmitJob(ElasticSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(WorkerIds(first), (std::vector<std::string>{a, b, c}));

  // c died (named); b's run hangs in its abort: it heartbeats, still running generation 1.
  FailRun(a, first, 0, {2});
  Beat(a);
  const absl::Duration wait = JobManagerOptions().RegroupWait();
  clock_.Advance(wait - absl::Milliseconds(1));
  EXPECT_EQ(Beat(b, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  manager_->Tick();
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  clock_.Advance(absl::Milliseconds(1));
  manager_->Tick();
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.state(), v1::RUNNING);
  EXPECT_EQ(WorkerIds(second), (std::vector<std::string>{a}));
  const std::vector<std::string> notices = NoticesOf(Events(job->id()));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0], absl::StrCat("stopped waiting for ", b,
                                     " (rank 1) of generation 1: not back "
                                     "within ",
                                     absl::FormatDuration(wait), " of its end"));
  // Back late, b is a spare like any other.
  EXPECT_EQ(Beat(b).kind(), v1::ASSIGNMENT_IDLE);
}

TEST_F(JobManagerTest, ASurvivorThatGoesDeadOrLeavesIsNotWaitedFor) {
  regroup_wait_ = absl::Minutes(1);
  StartFresh("long-wait");
  const std::string a = Register("a");
  const std::string b = Register("b");
  const std::string c = Register("c");
  const std::string d = Register("d");
  auto job = manager_->SubmitJob(ElasticSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(WorkerIds(first), (std::vector<std::string>{a, b, c, d}));

  // c died (named); d leaves before it is back; b goes silent and its lease ends.
  FailRun(a, first, 0, {2});
  Beat(a);
  ASSERT_TRUE(manager_->LeaveWorker(d).ok());
  manager_->Tick();
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING) << "b is still awaited";
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat(a);
    manager_->Tick();
  }
  ASSERT_EQ(manager_->ListWorkers(v1::DEAD).size(), 2u);  // b and c
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.state(), v1::RUNNING);
  EXPECT_EQ(WorkerIds(second), (std::vector<std::string>{a}));
  EXPECT_TRUE(NoticesOf(Events(job->id())).empty());
}

TEST_F(JobManagerTest, SurvivorsBackAreHeldForTheirJobWhileItRegroups) {
  const std::string a = Register("a");
  const std::string b = Register("b");
  v1::JobSpec spec = ElasticSpec();
  spec.set_max_workers(2);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  FailRun(a, first, 0, {});
  Beat(a);
  // A later job that a would fit does not get it.
  auto later = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(manager_->GetJob(later->id())->state(), v1::PENDING);
  EXPECT_EQ(Beat(b, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  Beat(b);
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.state(), v1::RUNNING);
  EXPECT_EQ(WorkerIds(second), (std::vector<std::string>{a, b}));
  EXPECT_EQ(manager_->GetJob(later->id())->state(), v1::PENDING);
}

// ---- The state machine: one test per edge of the diagram in job_manager.h ----

using Path = std::vector<v1::JobState>;

TEST_F(JobManagerTest, Edge1PendingToRunningWhenWorkersAreIdle) {
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::PENDING);
  Register("a");
  const v1::Job running = *manager_->GetJob(job->id());
  EXPECT_EQ(running.state(), v1::RUNNING);
  EXPECT_EQ(running.generation(), 1);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING}));
}

TEST_F(JobManagerTest, Edge2PendingToFailedWhenThePlanCannotBeBuilt) {
  const v1::Job stored = UnplannableJob(v1::PENDING);
  StartWithStoredJob(stored, {v1::PENDING});
  ASSERT_EQ(manager_->GetJob(stored.id())->state(), v1::PENDING);
  const std::string a = Register("a");
  const v1::Job failed = *manager_->GetJob(stored.id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.message().rfind("cannot plan: ", 0), 0u) << failed.message();
  EXPECT_EQ(failed.generation(), 0);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_EQ(StatePath(stored.id()), (Path{v1::PENDING, v1::FAILED}));
}

TEST_F(JobManagerTest, Edge3PendingToCancelled) {
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  auto cancelled = manager_->CancelJob(job->id(), "not needed");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::CANCELLED}));
}

TEST_F(JobManagerTest, Edge4RunningToSucceededWhenEveryRankFinished) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_TRUE(Finish(running, 1).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(Finish(running, 0).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::SUCCEEDED}));
}

// Edges (5) and (6) through every way a worker is lost.
TEST_F(JobManagerTest, Edges5And6LostWorkerEndsTheGenerationRecoveringOrFailed) {
  struct Case {
    int max_attempts;
    v1::JobState expected;
  };
  for (Loss loss : {Loss::kLeft, Loss::kLeaseExpired, Loss::kRunFailed}) {
    for (const Case& c : {Case{2, v1::RECOVERING}, Case{1, v1::FAILED}}) {
      SCOPED_TRACE(absl::StrCat(LossName(loss), ", max_attempts ", c.max_attempts));
      StartFresh(absl::StrCat(LossName(loss), "-", c.max_attempts));
      const std::string a = Register("a");
      v1::JobSpec spec = SeedSpec(1);
      spec.set_max_attempts(c.max_attempts);
      auto job = manager_->SubmitJob(spec);
      ASSERT_TRUE(job.ok()) << job.status();
      const v1::Job running = *manager_->GetJob(job->id());
      ASSERT_EQ(running.state(), v1::RUNNING);
      Lose(loss, a, running);
      const v1::Job ended = *manager_->GetJob(job->id());
      EXPECT_EQ(ended.state(), c.expected);
      EXPECT_NE(ended.message().find("generation 1 ended: worker " + a), std::string::npos)
          << ended.message();
      EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, c.expected}));
    }
  }
}

TEST_F(JobManagerTest, Edges5And6AdoptionWindowEndsTheGenerationRecoveringOrFailed) {
  struct Case {
    int max_attempts;
    v1::JobState expected;
  };
  for (const Case& c : {Case{2, v1::RECOVERING}, Case{1, v1::FAILED}}) {
    SCOPED_TRACE(absl::StrCat("max_attempts ", c.max_attempts));
    StartFresh(absl::StrCat("max-attempts-", c.max_attempts));
    Register("a");
    v1::JobSpec spec = SeedSpec(1);
    spec.set_max_attempts(c.max_attempts);
    auto job = manager_->SubmitJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
    Start(dir_);
    EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);  // adopting
    EndAdoptionWindow();
    const v1::Job restarted = *manager_->GetJob(job->id());
    EXPECT_EQ(restarted.state(), c.expected);
    EXPECT_NE(restarted.message().find("coordinator restarted"), std::string::npos);
    EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, c.expected}));
  }
}

TEST_F(JobManagerTest, Edge7RunningToCancelledAbortsTheGeneration) {
  const std::string a = Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  auto cancelled = manager_->CancelJob(job->id(), "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(Beat(a, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::CANCELLED}));
}

TEST_F(JobManagerTest, Edge8RecoveringToRunningInTheNextGeneration) {
  const std::string a = Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(manager_->LeaveWorker(a).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  Register("b");
  const v1::Job running = *manager_->GetJob(job->id());
  EXPECT_EQ(running.state(), v1::RUNNING);
  EXPECT_EQ(running.generation(), 2);
  EXPECT_EQ(running.attempts(), 2);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::RECOVERING, v1::RUNNING}));
}

TEST_F(JobManagerTest, Edge9RecoveringToFailedWhenThePlanCannotBeBuilt) {
  v1::Job stored = UnplannableJob(v1::RECOVERING);
  stored.set_generation(1);
  stored.set_attempts(1);
  StartWithStoredJob(stored, {v1::PENDING, v1::RUNNING, v1::RECOVERING});
  ASSERT_EQ(manager_->GetJob(stored.id())->state(), v1::RECOVERING);
  const std::string a = Register("a");
  const v1::Job failed = *manager_->GetJob(stored.id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.message().rfind("cannot plan: ", 0), 0u) << failed.message();
  EXPECT_EQ(failed.generation(), 1);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_EQ(StatePath(stored.id()), (Path{v1::PENDING, v1::RUNNING, v1::RECOVERING, v1::FAILED}));
}

TEST_F(JobManagerTest, Edge10RecoveringToCancelled) {
  const std::string a = Register("a");
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(manager_->LeaveWorker(a).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  auto cancelled = manager_->CancelJob(job->id(), "gave up");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::RECOVERING, v1::CANCELLED}));
}

TEST_F(JobManagerTest, Edge11EveryRankBackAdoptsTheGenerationUnchanged) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  const v1::Assignment before[] = {Beat(running.worker_ids(0)), Beat(running.worker_ids(1))};
  ASSERT_TRUE(Report(running, 0, 3).ok());

  Start(dir_);
  const std::vector<v1::JobEvent> restarted = Events(job->id());
  EXPECT_EQ(restarted.back().type(), v1::NOTICE);
  EXPECT_TRUE(absl::StrContains(restarted.back().message(), "adopting generation 1"))
      << restarted.back().message();
  // The old ids are unknown until their workers register again.
  v1::HeartbeatRequest old_id;
  old_id.set_worker_id(running.worker_ids(0));
  EXPECT_EQ(manager_->Heartbeat(old_id).status().code(), absl::StatusCode::kNotFound);
  // Rank 0 trains on meanwhile: its reports are accepted.
  auto early = Report(running, 0, 4);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE(early->continue_running());

  const v1::RegisterWorkerResponse rank1 = Reregister(running.worker_ids(1), job->id(), 1, 1);
  EXPECT_TRUE(rank1.adopted());
  EXPECT_EQ(rank1.worker_id(), running.worker_ids(1));
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING}));  // rank 0 is missing
  const v1::RegisterWorkerResponse rank0 = Reregister(running.worker_ids(0), job->id(), 1, 0);
  EXPECT_TRUE(rank0.adopted());
  EXPECT_EQ(rank0.worker_id(), running.worker_ids(0));

  const v1::Job adopted = *manager_->GetJob(job->id());
  EXPECT_EQ(adopted.state(), v1::RUNNING);
  EXPECT_EQ(adopted.generation(), 1);
  EXPECT_EQ(adopted.attempts(), 1);
  EXPECT_EQ(adopted.message(), "generation 1 adopted after a coordinator restart");
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::RUNNING}));
  // Each rank gets the very assignment it ran before the restart.
  for (int rank : {0, 1}) {
    const v1::Assignment now = Beat(running.worker_ids(rank), job->id(), 1);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(now, before[rank]))
        << "rank " << rank << ":\n"
        << now.DebugString() << "vs\n"
        << before[rank].DebugString();
  }
  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(job->id());
  auto plan = manager_->GetShardPlan(plan_request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layout_hash(), before[0].plan_layout_hash());

  // A report recorded before the restart and sent again is recorded once; new steps go on.
  const size_t events = Events(job->id()).size();
  ASSERT_TRUE(Report(running, 0, 4).ok());
  EXPECT_EQ(Events(job->id()).size(), events);
  ASSERT_TRUE(Report(running, 0, 8).ok());
  EXPECT_EQ(Events(job->id()).size(), events + 1);
  EXPECT_EQ(manager_->GetJob(job->id())->progress().step(), 8);
  ASSERT_TRUE(Finish(running, 0).ok());
  ASSERT_TRUE(Finish(running, 1).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
}

TEST_F(JobManagerTest, AdoptedRanksGetTheGenerationsStoredAssignment) {
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_workers(2);
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(first.worker_ids_size(), 2);
  ASSERT_TRUE(Commit(first, 0, 7).ok());
  ASSERT_TRUE(Commit(first, 1, 7).ok());
  Lose(Loss::kLeft, b, first);
  ASSERT_EQ(Beat(a, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  const v1::Assignment second = Beat(a);
  ASSERT_EQ(second.generation(), 2);
  ASSERT_EQ(second.start_step(), 7);
  // A later checkpoint becomes the job's latest; generation 2 still runs from step 7.
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_TRUE(Commit(running, 0, 12).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 12);

  Start(dir_);
  ASSERT_TRUE(Reregister(a, job->id(), 2, 0).adopted());
  const v1::Assignment adopted = Beat(a, job->id(), 2);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(adopted, second))
      << adopted.DebugString() << "vs\n"
      << second.DebugString();
  EXPECT_EQ(adopted.resume_from().step(), 7);
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 12);
}

TEST_F(JobManagerTest, AdoptionWindowEndsWithARankMissing) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());

  Start(dir_);
  const std::string back = running.worker_ids(0);
  ASSERT_TRUE(Reregister(back, job->id(), 1, 0).adopted());
  clock_.Advance(JobManagerOptions().AdoptionWindow() - absl::Milliseconds(1));
  Beat(back);
  manager_->Tick();
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);  // not yet
  EndAdoptionWindow({back});

  const v1::Job ended = *manager_->GetJob(job->id());
  EXPECT_EQ(ended.state(), v1::RECOVERING);
  EXPECT_TRUE(absl::StrContains(ended.message(),
                                "generation 1 ended: coordinator restarted: ranks 1 did not come "
                                "back within"))
      << ended.message();
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::RECOVERING}));
  // The rank that came back is told to abort; the late one cannot be adopted any more.
  EXPECT_EQ(Beat(back, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  const v1::RegisterWorkerResponse late = Reregister(running.worker_ids(1), job->id(), 1, 1);
  EXPECT_FALSE(late.adopted());
  EXPECT_NE(late.worker_id(), running.worker_ids(1));
  // Once both run nothing, the job starts its next generation on them.
  EXPECT_EQ(Beat(back).kind(), v1::ASSIGNMENT_RUN);
  const v1::Job next = *manager_->GetJob(job->id());
  EXPECT_EQ(next.state(), v1::RUNNING);
  EXPECT_EQ(next.generation(), 2);
  EXPECT_EQ(next.attempts(), 2);
}

TEST_F(JobManagerTest, AStatusOfAnotherGenerationIsNotAdopted) {
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  Lose(Loss::kLeft, a, first);
  ASSERT_EQ(Beat(b, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  Beat(b);
  const std::string c = Register("c");
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.generation(), 2);

  Start(dir_);
  // b presents generation 1, which it no longer runs; a was never in generation 2.
  const int b_rank = second.worker_ids(0) == b ? 0 : 1;
  const v1::RegisterWorkerResponse stale_b = Reregister(b, job->id(), 1, b_rank);
  EXPECT_FALSE(stale_b.adopted());
  EXPECT_NE(stale_b.worker_id(), b);
  EXPECT_EQ(Beat(stale_b.worker_id()).kind(), v1::ASSIGNMENT_IDLE);
  const v1::RegisterWorkerResponse stale_a = Reregister(a, job->id(), 1, 0);
  EXPECT_FALSE(stale_a.adopted());
  EXPECT_NE(stale_a.worker_id(), a);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::RECOVERING, v1::RUNNING}));
  // The refusals took no id: generation 2's workers still get theirs back.
  EXPECT_TRUE(Reregister(b, job->id(), 2, b_rank).adopted());
  EXPECT_TRUE(Reregister(c, job->id(), 2, 1 - b_rank).adopted());
  EXPECT_EQ(manager_->GetJob(job->id())->generation(), 2);
  EXPECT_EQ(StatePath(job->id()),
            (Path{v1::PENDING, v1::RUNNING, v1::RECOVERING, v1::RUNNING, v1::RUNNING}));
}

// Issue 24, item 3. Before it every ReportProgress notice and every failed or skipped commit
// added a durable NOTICE, without end.
TEST_F(JobManagerTest, WorkerNoticesAreBoundedPerGenerationAndTheRestCounted) {
  max_notices_per_generation_ = 3;
  Start(dir_);
  Register("a");
  v1::JobSpec spec = SeedSpec(1);
  spec.set_max_attempts(2);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  const auto notices = [&] {
    std::vector<std::string> messages;
    for (const v1::JobEvent& event : Events(job->id())) {
      if (event.type() == v1::NOTICE) messages.push_back(event.message());
    }
    return messages;
  };
  for (int i = 0; i < 8; ++i) {
    v1::ReportProgressRequest request;
    request.set_worker_id(running.worker_ids(0));
    request.set_job_id(running.id());
    request.set_generation(1);
    request.set_notice(absl::StrCat("notice ", i));
    ASSERT_TRUE(manager_->ReportProgress(request).ok());
  }
  v1::CommitCheckpointRequest skipped;
  skipped.set_worker_id(running.worker_ids(0));
  skipped.set_job_id(running.id());
  skipped.set_generation(1);
  skipped.set_step(10);
  skipped.set_outcome(v1::CHECKPOINT_SKIPPED);
  ASSERT_TRUE(manager_->CommitCheckpoint(skipped).ok());
  std::vector<std::string> stored = notices();
  ASSERT_EQ(stored.size(), 4u) << absl::StrJoin(stored, " | ");
  EXPECT_EQ(stored[2], "rank 0: notice 2");
  EXPECT_TRUE(absl::StrContains(stored[3], "--max_notices_per_generation")) << stored[3];
  // notice 3 (replaced by the bound's notice) to notice 7, and the skipped commit.
  EXPECT_EQ(manager_->GetJob(job->id())->dropped_notices(), 6);
  // The generation ends: a closing NOTICE counts them; the next one starts afresh.
  ASSERT_TRUE(manager_->LeaveWorker(running.worker_ids(0)).ok());
  stored = notices();
  ASSERT_EQ(stored.size(), 5u);
  EXPECT_EQ(stored[4], "generation 1 dropped 6 notices from its workers past the bound of 3");
  Register("b");
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.generation(), 2);
  v1::ReportProgressRequest request;
  request.set_worker_id(second.worker_ids(0));
  request.set_job_id(second.id());
  request.set_generation(2);
  request.set_notice("fresh");
  ASSERT_TRUE(manager_->ReportProgress(request).ok());
  EXPECT_EQ(notices().back(), "rank 0: fresh");
  EXPECT_EQ(manager_->GetJob(job->id())->dropped_notices(), 6);
}

// Issue 24, item 2. Before it, spec.checkpoint.dir could name another job's directory (its id,
// or any relative path), so one job could prune, overwrite or resume from another's checkpoints.
TEST_F(JobManagerTest, ACheckpointDirectoryBelongsToTheFirstJobThatNamedIt) {
  v1::JobSpec spec = SeedSpec(4);
  spec.mutable_checkpoint()->set_dir("team/run");
  absl::StatusOr<v1::Job> first = manager_->SubmitJob(spec, "alice", false);
  ASSERT_TRUE(first.ok()) << first.status();
  const auto refused = [&](const std::string& dir, const std::string& submitter,
                           bool admin) -> absl::Status {
    v1::JobSpec other = SeedSpec(4);
    other.mutable_checkpoint()->set_dir(dir);
    return manager_->SubmitJob(other, submitter, admin).status();
  };
  // The same directory (one spec file submitted twice), one inside it, one above it.
  for (const char* dir : {"team/run", "team/run/inner", "team"}) {
    const absl::Status status = refused(dir, "alice", false);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << dir << ": " << status;
    EXPECT_TRUE(absl::StartsWith(status.message(), "checkpoint.dir: ")) << status;
    // Alice submitted the owner: she is told which job it is.
    EXPECT_TRUE(absl::StrContains(status.message(), first->id())) << status;
  }
  // Another submitter is not told whose it is; an admin is.
  const absl::Status mallory = refused("team/run", "mallory", false);
  EXPECT_EQ(mallory.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(absl::StrContains(mallory.message(), first->id())) << mallory;
  EXPECT_TRUE(absl::StrContains(refused("team", "root", true).message(), first->id()));
  // Another job's default directory (its id), or one not given yet, cannot be named.
  EXPECT_EQ(refused(first->id(), "alice", true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused("job-000099/x", "alice", true).message(), "job id"));
  // Siblings are free, and a later job's default directory is its own.
  EXPECT_TRUE(refused("team/run2", "bob", false).ok());
  absl::StatusOr<v1::Job> defaulted = manager_->SubmitJob(SeedSpec(4));
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  EXPECT_EQ(defaulted->spec().checkpoint().dir(), defaulted->id());
  // Forever: the claims hold after a restart, also the default one.
  Start(dir_);
  EXPECT_EQ(refused("team/run", "alice", false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused("team/run2/x", "alice", false).code(), absl::StatusCode::kInvalidArgument);
}

// Issue 23 ("Worker identity" in job_manager.h). Registrations as a worker-role caller makes
// them: with `secret`, or none.
RegistrationProof WorkerProof(const std::string& secret = "") {
  RegistrationProof proof;
  proof.acts_for_any_worker = false;
  proof.presented_secret = secret;
  return proof;
}

v1::RegisterWorkerRequest Registration(const std::string& name,
                                       const std::string& previous_worker_id = "") {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_host("host-a");
  request.set_device_kind(v1::CPU);
  request.set_previous_worker_id(previous_worker_id);
  return request;
}

// Before issue 23 a second live registration of a name was accepted (scheduling took the newest).
TEST_F(JobManagerTest, AWorkerNameIsBoundToItsLiveRegistrationUntilItIsDead) {
  const std::string a = Register("a");
  absl::StatusOr<v1::RegisterWorkerResponse> again =
      manager_->RegisterWorker(Registration("a"), WorkerProof());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), a)) << again.status();
  // Nor may an admin take it without naming it (it names no previous registration).
  EXPECT_EQ(manager_->RegisterWorker(Registration("a")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(manager_->ListWorkers(v1::WORKER_STATE_UNSPECIFIED).size(), 1u);
  clock_.Advance(JobManagerOptions().lease.lease() + absl::Seconds(1));
  manager_->Tick();
  ASSERT_EQ(manager_->ListWorkers(v1::DEAD).size(), 1u);
  // Dead, its name is still its own (issue 36) until it has been gone for the retention.
  EXPECT_EQ(manager_->RegisterWorker(Registration("a"), WorkerProof()).status().code(),
            absl::StatusCode::kAlreadyExists);
  clock_.Advance(JobManagerOptions().forget_gone_workers_after);
  manager_->Tick();
  absl::StatusOr<v1::RegisterWorkerResponse> after =
      manager_->RegisterWorker(Registration("a"), WorkerProof());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(after->worker_id(), a);
}

// Issue 36, row 1. Fails before the fix: once "a" was DEAD (its daemon killed) a worker token
// registered the name without any proof and kept it; the real daemon was then refused forever.
// Now a known name that is not live goes only to its holder (its id and secret) until the holder
// has been gone for --dead_worker_retention; the refusal names the rule and when it ends.
TEST_F(JobManagerTest, ANameThatIsNotLiveGoesOnlyToItsHolderUntilTheRetentionPassed) {
  absl::StatusOr<v1::RegisterWorkerResponse> a =
      manager_->RegisterWorker(Registration("a"), WorkerProof());
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<v1::RegisterWorkerResponse> b =
      manager_->RegisterWorker(Registration("b"), WorkerProof());
  ASSERT_TRUE(b.ok()) << b.status();
  clock_.Advance(JobManagerOptions().lease.lease() + absl::Seconds(1));
  Beat(b->worker_id());
  manager_->Tick();
  ASSERT_EQ(manager_->ListWorkers(v1::DEAD).size(), 1u);

  // A squatter: no proof, a's id with a made-up secret, a's id with b's (a real) secret.
  const std::pair<std::string, std::string> claims[] = {
      {"", ""}, {a->worker_id(), std::string(64, 'f')}, {a->worker_id(), b->worker_secret()}};
  for (const auto& [previous, secret] : claims) {
    SCOPED_TRACE(previous + " " + secret);
    const absl::Status refused =
        manager_->RegisterWorker(Registration("a", previous), WorkerProof(secret)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "held by proof")) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), a->worker_id())) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "--dead_worker_retention (10m): in 10m"))
        << refused;
  }
  // The real daemon (its previous id and secret, as its identity file keeps them) gets it back.
  absl::StatusOr<v1::RegisterWorkerResponse> back =
      manager_->RegisterWorker(Registration("a", a->worker_id()), WorkerProof(a->worker_secret()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->worker_id(), a->worker_id());

  // It leaves; its name is held for its new registration now, and the old proof is spent.
  ASSERT_TRUE(manager_->LeaveWorker(back->worker_id()).ok());
  EXPECT_EQ(
      manager_->RegisterWorker(Registration("a", a->worker_id()), WorkerProof(a->worker_secret()))
          .status()
          .code(),
      absl::StatusCode::kAlreadyExists);
  clock_.Advance(JobManagerOptions().forget_gone_workers_after - absl::Seconds(1));
  Beat(b->worker_id());
  manager_->Tick();
  EXPECT_EQ(manager_->RegisterWorker(Registration("a"), WorkerProof()).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Gone past the retention: the name is anyone's.
  clock_.Advance(absl::Seconds(2));
  Beat(b->worker_id());
  manager_->Tick();
  absl::StatusOr<v1::RegisterWorkerResponse> anyone =
      manager_->RegisterWorker(Registration("a"), WorkerProof());
  ASSERT_TRUE(anyone.ok()) << anyone.status();
}

// Issue 36, row 1. Fails before the fix: a restarted coordinator knew no names, so a worker token
// that registered first took the name of a worker that had been live before the restart, and the
// real daemon, re-registering with its id and secret, was refused ALREADY_EXISTS forever. Names
// are stored with their holders now: after a restart the holder proves itself as before, a name
// whose holder never comes back frees a retention after the start, and an unknown name is free.
TEST_F(JobManagerTest, ANameStaysItsHoldersAcrossACoordinatorRestart) {
  absl::StatusOr<v1::RegisterWorkerResponse> a =
      manager_->RegisterWorker(Registration("a"), WorkerProof());
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<v1::RegisterWorkerResponse> gone =
      manager_->RegisterWorker(Registration("gone"), WorkerProof());
  ASSERT_TRUE(gone.ok()) << gone.status();

  Start(dir_);
  for (const char* name : {"a", "gone"}) {
    const absl::Status refused =
        manager_->RegisterWorker(Registration(name), WorkerProof()).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << name << ": " << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "held by proof")) << refused;
  }
  EXPECT_TRUE(manager_->RegisterWorker(Registration("new"), WorkerProof()).ok());
  absl::StatusOr<v1::RegisterWorkerResponse> back =
      manager_->RegisterWorker(Registration("a", a->worker_id()), WorkerProof(a->worker_secret()));
  ASSERT_TRUE(back.ok()) << back.status();

  // Another restart: "a" is held for its new registration; "gone" is still held, for a retention
  // counted from this start.
  Start(dir_);
  EXPECT_EQ(
      manager_->RegisterWorker(Registration("a", a->worker_id()), WorkerProof(a->worker_secret()))
          .status()
          .code(),
      absl::StatusCode::kAlreadyExists);
  clock_.Advance(JobManagerOptions().forget_gone_workers_after + absl::Seconds(1));
  manager_->Tick();
  absl::StatusOr<v1::RegisterWorkerResponse> taken =
      manager_->RegisterWorker(Registration("gone"), WorkerProof());
  ASSERT_TRUE(taken.ok()) << taken.status();
  // Forgotten in the store too: the next restart holds it for its new holder only.
  Start(dir_);
  EXPECT_EQ(manager_
                ->RegisterWorker(Registration("gone", gone->worker_id()),
                                 WorkerProof(gone->worker_secret()))
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(manager_
                  ->RegisterWorker(Registration("gone", taken->worker_id()),
                                   WorkerProof(taken->worker_secret()))
                  .ok());
}

// Before issue 23 naming previous_worker_id revoked that worker's secret, with no proof.
TEST_F(JobManagerTest, NamingAPreviousIdWithoutItsSecretRevokesNothing) {
  absl::StatusOr<v1::RegisterWorkerResponse> a = manager_->RegisterWorker(Registration("a"));
  ASSERT_TRUE(a.ok()) << a.status();
  for (const std::string& wrong : {std::string(), std::string(64, '0')}) {
    absl::StatusOr<v1::RegisterWorkerResponse> claim = manager_->RegisterWorker(
        Registration(absl::StrCat("claim-", wrong.size()), a->worker_id()), WorkerProof(wrong));
    ASSERT_TRUE(claim.ok()) << claim.status();
    EXPECT_NE(claim->worker_id(), a->worker_id());
    EXPECT_TRUE(manager_->CheckWorkerSecret(a->worker_id(), a->worker_secret()).ok());
  }
  // With the secret, the worker replaces its own registration: the old secret stops working.
  absl::StatusOr<v1::RegisterWorkerResponse> replaced =
      manager_->RegisterWorker(Registration("a", a->worker_id()), WorkerProof(a->worker_secret()));
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(manager_->CheckWorkerSecret(a->worker_id(), a->worker_secret()).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(manager_->CheckWorkerSecret(replaced->worker_id(), replaced->worker_secret()).ok());
  // An id this coordinator does not know is NOT_FOUND: register again.
  EXPECT_EQ(manager_->CheckWorkerSecret("worker-999999", a->worker_secret()).code(),
            absl::StatusCode::kNotFound);
}

// Before issue 23 any caller naming a rank's id and run was adopted into it after a restart.
TEST_F(JobManagerTest, AdoptionNeedsTheRanksSecretAndReservesItsWorkersName) {
  absl::StatusOr<v1::RegisterWorkerResponse> a = manager_->RegisterWorker(Registration("a"));
  ASSERT_TRUE(a.ok()) << a.status();
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);

  Start(dir_);
  // Until its daemon re-registers, the rank's calls (reports, commits) go on with its secret.
  EXPECT_TRUE(manager_->CheckWorkerSecret(a->worker_id(), a->worker_secret()).ok());
  EXPECT_EQ(manager_->CheckWorkerSecret(a->worker_id(), std::string(64, 'f')).code(),
            absl::StatusCode::kNotFound);
  v1::RegisterWorkerRequest claim = Registration("intruder", a->worker_id());
  claim.mutable_status()->set_job_id(job->id());
  claim.mutable_status()->set_generation(1);
  claim.mutable_status()->set_rank(0);
  absl::StatusOr<v1::RegisterWorkerResponse> refused =
      manager_->RegisterWorker(claim, WorkerProof(std::string(64, 'f')));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->adopted());
  EXPECT_NE(refused->worker_id(), a->worker_id());
  // The rank's worker's name is reserved for it while the generation is being adopted.
  claim.set_name("a");
  absl::StatusOr<v1::RegisterWorkerResponse> reserved =
      manager_->RegisterWorker(claim, WorkerProof());
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kAlreadyExists) << reserved.status();
  EXPECT_TRUE(absl::StrContains(reserved.status().message(), "reserved")) << reserved.status();
  // The worker itself, with its secret.
  absl::StatusOr<v1::RegisterWorkerResponse> adopted =
      manager_->RegisterWorker(claim, WorkerProof(a->worker_secret()));
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_TRUE(adopted->adopted());
  EXPECT_EQ(adopted->worker_id(), a->worker_id());
  // It keeps its secret: calls its run has in flight carry it.
  EXPECT_EQ(adopted->worker_secret(), a->worker_secret());
  EXPECT_TRUE(manager_->CheckWorkerSecret(a->worker_id(), a->worker_secret()).ok());

  // After another restart the same secret proves the rank again; a wrong one still does not.
  Start(dir_);
  EXPECT_EQ(manager_->RegisterWorker(claim, WorkerProof(std::string(64, 'f'))).status().code(),
            absl::StatusCode::kAlreadyExists);
  absl::StatusOr<v1::RegisterWorkerResponse> again =
      manager_->RegisterWorker(claim, WorkerProof(adopted->worker_secret()));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->adopted());
}

// A worker whose run cannot be adopted (it presents another generation) is not kept out by the
// reservation of its own name: it registers as a new worker at once.
TEST_F(JobManagerTest, ARanksOwnWorkerIsNotKeptOutByItsNamesReservation) {
  absl::StatusOr<v1::RegisterWorkerResponse> a = manager_->RegisterWorker(Registration("a"));
  ASSERT_TRUE(a.ok()) << a.status();
  auto job = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  Start(dir_);
  v1::RegisterWorkerRequest stale = Registration("a", a->worker_id());
  stale.mutable_status()->set_job_id(job->id());
  stale.mutable_status()->set_generation(7);
  absl::StatusOr<v1::RegisterWorkerResponse> registered =
      manager_->RegisterWorker(stale, WorkerProof(a->worker_secret()));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_FALSE(registered->adopted());
}

TEST_F(JobManagerTest, AdoptedIdsNeverCollideWithOthers) {
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());

  Start(dir_);
  const std::string fresh = Register("fresh");
  EXPECT_NE(fresh, a);
  EXPECT_NE(fresh, b);
  const std::string rank0 = running.worker_ids(0);
  const std::string rank1 = running.worker_ids(1);
  ASSERT_TRUE(Reregister(rank0, job->id(), 1, 0).adopted());
  // A second claimant of the same id, or of another rank's id, gets an id of its own.
  const v1::RegisterWorkerResponse twice = Reregister(rank0, job->id(), 1, 0);
  EXPECT_FALSE(twice.adopted());
  const v1::RegisterWorkerResponse wrong_rank = Reregister(rank1, job->id(), 1, 0);
  EXPECT_FALSE(wrong_rank.adopted());
  ASSERT_TRUE(Reregister(rank1, job->id(), 1, 1).adopted());
  const std::string later = Register("later");
  std::set<std::string> ids;
  for (const v1::WorkerInfo& worker : manager_->ListWorkers(v1::WORKER_STATE_UNSPECIFIED)) {
    EXPECT_TRUE(ids.insert(worker.id()).second) << "listed twice: " << worker.id();
  }
  EXPECT_EQ(ids,
            (std::set<std::string>{a, b, fresh, twice.worker_id(), wrong_rank.worker_id(), later}));
  EXPECT_EQ(manager_->ListWorkers(v1::BUSY).size(), 2u);
  EXPECT_EQ(manager_->GetJob(job->id())->message(),
            "generation 1 adopted after a coordinator restart");
}

TEST_F(JobManagerTest, ARankThatFinishedBeforeTheRestartCountsAsFinished) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_TRUE(Finish(running, 1).ok());

  Start(dir_);
  ASSERT_TRUE(Reregister(running.worker_ids(1), job->id(), 1, 1, /*finished=*/true).adopted());
  ASSERT_TRUE(Reregister(running.worker_ids(0), job->id(), 1, 0).adopted());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(Finish(running, 0).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::RUNNING, v1::SUCCEEDED}));
}

TEST_F(JobManagerTest, CancellingWhileAdoptingAbortsTheRanksBack) {
  Register("a");
  Register("b");
  auto job = manager_->SubmitJob(SeedSpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());

  Start(dir_);
  ASSERT_TRUE(Reregister(running.worker_ids(0), job->id(), 1, 0).adopted());
  ASSERT_TRUE(manager_->CancelJob(job->id(), "test").ok());
  EXPECT_EQ(Beat(running.worker_ids(0), job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_FALSE(Reregister(running.worker_ids(1), job->id(), 1, 1).adopted());
  EndAdoptionWindow({running.worker_ids(0)});  // nothing left to end
  EXPECT_EQ(StatePath(job->id()), (Path{v1::PENDING, v1::RUNNING, v1::CANCELLED}));
}

// ---- Attached jobs ----

TEST_F(JobManagerTest, AttachedJobRunsOnItsPinnedWorkersInItsRankOrderWithTheirSockets) {
  // An unpinned worker registered first, and hosts in the opposite order of the ranks: a job the
  // scheduler placed would start elsewhere or in another order.
  const std::string other = RegisterAttachable("other", "host-0");
  const std::string a = RegisterAttachable("node-a", "host-1");
  const std::string b = RegisterAttachable("node-b", "host-2");
  auto job = manager_->SubmitJob(AttachedSpec({"node-b", "node-a"}));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().steps(), 0);
  EXPECT_EQ(job->spec().min_workers(), 2);
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING) << running.message();
  EXPECT_EQ(std::vector<std::string>(running.worker_ids().begin(), running.worker_ids().end()),
            (std::vector<std::string>{b, a}));
  for (const auto& [rank, worker_id, name] :
       {std::tuple(0, b, "node-b"), std::tuple(1, a, "node-a")}) {
    const v1::Assignment assignment = Beat(worker_id);
    EXPECT_EQ(assignment.kind(), v1::ASSIGNMENT_RUN);
    EXPECT_EQ(assignment.rank(), rank);
    EXPECT_EQ(assignment.world_size(), 2);
    EXPECT_EQ(assignment.attach_socket(), SocketOf(name)) << "rank " << rank;
  }
  // A built-in job's ranks get no socket, even on a worker that has one.
  auto builtin = manager_->SubmitJob(SeedSpec(1));
  ASSERT_EQ(manager_->GetJob(builtin->id())->state(), v1::RUNNING);
  EXPECT_EQ(Beat(other).kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(Beat(other).attach_socket(), "");

  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(job->id());
  plan_request.set_include_layout(true);
  auto plan = manager_->GetShardPlan(plan_request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tensors_size(), 4);
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(plan->tensors(t).name(), job->spec().workload().attached().tensors(t).name());
  }
  EXPECT_EQ(plan->layout_hash(), Beat(a).plan_layout_hash());

  // No fixed step count: progress goes on past any number, and the job ends when every rank
  // finished.
  ASSERT_TRUE(Report(running, 0, 250).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->progress().step(), 250);
  ASSERT_TRUE(Finish(running, 1).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(Finish(running, 0).ok());
  const v1::Job succeeded = *manager_->GetJob(job->id());
  EXPECT_EQ(succeeded.state(), v1::SUCCEEDED);
  EXPECT_EQ(succeeded.progress().step(), 250);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_EQ(Beat(a).attach_socket(), "");
}

TEST_F(JobManagerTest, AttachedJobWaitsUntilEveryPinnedWorkerIsRegisteredAndIdle) {
  const std::string b = RegisterAttachable("node-b");
  auto builtin = manager_->SubmitJob(SeedSpec(1));
  ASSERT_EQ(manager_->GetJob(builtin->id())->worker_ids(0), b);
  auto job = manager_->SubmitJob(AttachedSpec({"node-a", "node-b"}));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::PENDING);  // node-a unknown, node-b busy
  const std::string a = RegisterAttachable("node-a");
  RegisterAttachable("node-c");
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::PENDING);  // node-b still busy
  // Long waits do not make it take other workers.
  clock_.Advance(absl::Minutes(5));
  for (const std::string& worker : {a, b}) Beat(worker);
  manager_->Tick();
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::PENDING);

  ASSERT_TRUE(Finish(*manager_->GetJob(builtin->id()), 0).ok());
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING) << running.message();
  EXPECT_EQ(running.worker_ids(0), a);
  EXPECT_EQ(running.worker_ids(1), b);
}

// A generation that ends goes to RECOVERING, and the next one waits for the same workers by name:
// a worker that left or died comes back under its name with a new id, one whose run failed
// becomes idle once it stops running the generation.
class AttachedRecoveryTest : public JobManagerTest, public ::testing::WithParamInterface<Loss> {};

TEST_P(AttachedRecoveryTest, TheNextGenerationWaitsForTheSamePinnedWorkers) {
  const Loss loss = GetParam();
  const std::string a = RegisterAttachable("node-a");
  const std::string b = RegisterAttachable("node-b");
  v1::JobSpec spec = AttachedSpec({"node-a", "node-b"});
  spec.set_max_attempts(2);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job first = *manager_->GetJob(job->id());
  ASSERT_EQ(first.state(), v1::RUNNING);

  if (loss == Loss::kLeaseExpired) {
    // Only node-a keeps beating.
    for (int i = 0; i < 4; ++i) {
      clock_.Advance(absl::Seconds(1));
      Beat(a, job->id(), 1);
      manager_->Tick();
    }
  } else {
    Lose(loss, b, first);
  }
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
  EXPECT_EQ(Beat(a, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_EQ(Beat(a).kind(), v1::ASSIGNMENT_IDLE);  // idle, but node-b is not yet
  std::string new_b = b;
  if (loss == Loss::kRunFailed) {
    EXPECT_EQ(Beat(b, job->id(), 1).kind(), v1::ASSIGNMENT_ABORT);
    EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
    Beat(b);  // it stopped running generation 1
  } else {
    // Another worker does not stand in for it, however long the job waits.
    const std::string c = RegisterAttachable("node-c");
    clock_.Advance(absl::Minutes(2));
    for (const std::string& worker : {a, c}) Beat(worker);
    manager_->Tick();
    EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RECOVERING);
    new_b = RegisterAttachable("node-b", "host-a", "/run/zeroshard/node-b-restarted.sock");
    EXPECT_NE(new_b, b);
  }
  const v1::Job second = *manager_->GetJob(job->id());
  ASSERT_EQ(second.state(), v1::RUNNING) << second.message();
  EXPECT_EQ(second.generation(), 2);
  EXPECT_EQ(second.attempts(), 2);
  EXPECT_EQ(second.worker_ids(0), a);
  EXPECT_EQ(second.worker_ids(1), new_b);
  const v1::Assignment rank1 = Beat(new_b);
  EXPECT_EQ(rank1.generation(), 2);
  EXPECT_EQ(rank1.rank(), 1);
  EXPECT_EQ(rank1.attach_socket(),
            loss == Loss::kRunFailed ? SocketOf("node-b") : "/run/zeroshard/node-b-restarted.sock");

  // max_attempts applies as for any job.
  Lose(Loss::kRunFailed, a, second);
  const v1::Job failed = *manager_->GetJob(job->id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(failed.message(), "no attempts left")) << failed.message();
}

INSTANTIATE_TEST_SUITE_P(Losses, AttachedRecoveryTest,
                         ::testing::Values(Loss::kLeft, Loss::kLeaseExpired, Loss::kRunFailed),
                         [](const ::testing::TestParamInfo<Loss>& info) {
                           std::string name = LossName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

TEST_F(JobManagerTest, AttachedJobFailsWhenAPinnedWorkerCannotRunItsRank) {
  // Already registered without a socket: the job fails at once.
  RegisterAttachable("node-a");
  RegisterAttachable("plain", "host-a", "");
  auto job = manager_->SubmitJob(AttachedSpec({"node-a", "plain"}));
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Job failed = *manager_->GetJob(job->id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(failed.message(),
                                "cannot run on its pinned workers: workload.attached.workers[1]: "
                                "worker plain (worker-"))
      << failed.message();
  EXPECT_TRUE(absl::StrContains(failed.message(), "registered without an attach_socket"))
      << failed.message();

  // Registering later with another device kind: the pending job fails then.
  auto cuda = manager_->SubmitJob(AttachedSpec({"node-a", "gpu-0"}));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ASSERT_EQ(cuda->state(), v1::PENDING);
  RegisterAttachable("gpu-0", "host-a", std::nullopt, v1::CUDA);
  failed = *manager_->GetJob(cuda->id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_TRUE(
      absl::StrContains(failed.message(), "workload.attached.workers[1]: worker gpu-0 (worker-"))
      << failed.message();
  EXPECT_TRUE(absl::StrContains(failed.message(), "is a CUDA worker; the job's device_kind is CPU"))
      << failed.message();
  EXPECT_EQ(StatePath(cuda->id()), (std::vector<v1::JobState>{v1::PENDING, v1::FAILED}));
}

TEST_F(JobManagerTest, AdoptedAttachedRanksKeepTheirSockets) {
  RegisterAttachable("node-a");
  RegisterAttachable("node-b");
  auto job = manager_->SubmitJob(AttachedSpec({"node-b", "node-a"}));
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  const v1::Assignment before[] = {Beat(running.worker_ids(0)), Beat(running.worker_ids(1))};
  ASSERT_EQ(before[0].attach_socket(), SocketOf("node-b"));

  Start(dir_);
  const char* const names[] = {"node-b", "node-a"};
  for (int rank : {1, 0}) {
    v1::RegisterWorkerRequest request;
    request.set_name(names[rank]);
    request.set_host("host-a");
    request.set_device_kind(v1::CPU);
    request.set_attach_socket(SocketOf(names[rank]));
    request.set_previous_worker_id(running.worker_ids(rank));
    request.mutable_status()->set_job_id(job->id());
    request.mutable_status()->set_generation(1);
    request.mutable_status()->set_rank(rank);
    absl::StatusOr<v1::RegisterWorkerResponse> registered = manager_->RegisterWorker(request);
    ASSERT_TRUE(registered.ok()) << registered.status();
    ASSERT_TRUE(registered->adopted()) << "rank " << rank;
  }
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
  for (int rank : {0, 1}) {
    const v1::Assignment now = Beat(running.worker_ids(rank), job->id(), 1);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(now, before[rank]))
        << "rank " << rank << ":\n"
        << now.DebugString() << "vs\n"
        << before[rank].DebugString();
  }
}

// Issue 27: an attached job has no fixed last step; without a step it exports its latest
// committed checkpoint (its final state once it SUCCEEDED), with its tied weights' aliases.
TEST_F(JobManagerTest, AnAttachedJobExportsItsLatestCommittedCheckpointWithoutAStep) {
  RegisterAttachable("node-a");
  v1::JobSpec spec = AttachedSpec({"node-a"});
  spec.mutable_workload()->mutable_attached()->mutable_tensors(1)->add_aliases("decoder.weight");
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  std::filesystem::create_directories(checkpoint_root_);
  const absl::Status none = manager_->FindExportCheckpoint(job->id(), std::nullopt).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "has no committed checkpoint yet (it is RUNNING)"))
      << none;
  ASSERT_TRUE(Commit(running, 0, 20).ok());
  ASSERT_TRUE(Commit(running, 0, 40).ok());
  absl::StatusOr<ExportSource> latest = manager_->FindExportCheckpoint(job->id(), std::nullopt);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->checkpoint.step, 40);
  EXPECT_FALSE(latest->is_final);
  EXPECT_EQ(latest->aliases,
            (checkpoint::CheckpointExport::Aliases{{"fc2.weight", {"decoder.weight"}}}));
  ASSERT_TRUE(Finish(running, 0).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->state(), v1::SUCCEEDED);
  latest = manager_->FindExportCheckpoint(job->id(), std::nullopt);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->checkpoint.step, 40);
  EXPECT_TRUE(latest->is_final);
  absl::StatusOr<ExportSource> step20 = manager_->FindExportCheckpoint(job->id(), 20);
  ASSERT_TRUE(step20.ok()) << step20.status();
  EXPECT_FALSE(step20->is_final);
  const absl::Status missing = manager_->FindExportCheckpoint(job->id(), 30).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_TRUE(absl::StrContains(missing.message(), "committed steps: 20, 40")) << missing;
}

// Issue 27, item 4: an attached trainer loads the state of step 30 at step 50. The checkpoints
// after step 30 are retired (moved aside, marked superseded) before the steps run again, so no
// committed manifest is overwritten; a commit one rank made before the load does not complete
// the step's new checkpoint; the job's latest checkpoint, progress and reports follow the step.
TEST_F(JobManagerTest, RewindRetiresTheCheckpointsAfterTheStepAndTheJobsStepFollows) {
  RegisterAttachable("node-a");
  RegisterAttachable("node-b");
  v1::JobSpec spec = AttachedSpec({"node-a", "node-b"});
  spec.mutable_checkpoint()->set_keep(10);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string job_dir =
      checkpoint::JobCheckpointDir(checkpoint_root_, running.spec().checkpoint().dir());
  auto manifest_of = [&](int64_t step) {
    std::ifstream in(checkpoint::ManifestPath(checkpoint::StepDir(job_dir, step)));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  std::map<int64_t, std::string> committed;
  for (int64_t step = 10; step <= 50; step += 10) {
    clock_.Advance(absl::Seconds(1));
    for (int rank : {0, 1}) ASSERT_TRUE(Commit(running, rank, step).ok());
    committed[step] = manifest_of(step);
    ASSERT_TRUE(Report(running, 0, step).ok());
  }
  // Rank 1 committed step 60 and rank 0 never will: the load came first.
  ASSERT_TRUE(Commit(running, 1, 60).ok());
  ASSERT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 50);

  v1::RewindJobRequest rewind;
  rewind.set_worker_id(running.worker_ids(0));
  rewind.set_job_id(running.id());
  rewind.set_generation(running.generation());
  rewind.set_rank(0);
  rewind.set_step(30);
  rewind.set_loaded_job_id(running.id());
  v1::CheckpointManifest loaded;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(committed[30], &loaded).ok());
  rewind.mutable_loaded_checkpoint()->set_step(30);
  rewind.mutable_loaded_checkpoint()->set_generation(loaded.generation());
  *rewind.mutable_loaded_checkpoint()->mutable_commit_time() = loaded.commit_time();
  rewind.set_reason("rank 0 loaded the state of step 30 at step 50");
  clock_.Advance(absl::Seconds(1));
  absl::StatusOr<v1::RewindJobResponse> rewound = manager_->RewindJob(rewind);
  ASSERT_TRUE(rewound.ok()) << rewound.status();
  EXPECT_EQ(
      std::vector<int64_t>(rewound->superseded_steps().begin(), rewound->superseded_steps().end()),
      (std::vector<int64_t>{40, 50}));
  EXPECT_EQ(rewound->latest_checkpoint().step(), 30);
  v1::Job after = *manager_->GetJob(job->id());
  EXPECT_EQ(after.latest_checkpoint().step(), 30);
  EXPECT_EQ(after.progress().step(), 30);
  EXPECT_EQ(after.rank_progress(0).step(), 30);
  // The retired manifests are aside, as committed but for the mark.
  for (int64_t step : {40, 50}) {
    EXPECT_FALSE(std::filesystem::exists(checkpoint::StepDir(job_dir, step))) << step;
    std::ifstream in(checkpoint::ManifestPath(
        absl::StrCat(job_dir, "/", checkpoint::SupersededDirName(step, 1))));
    const std::string marked_json((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    v1::CheckpointManifest marked, original;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(marked_json, &marked).ok()) << step;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(committed[step], &original).ok());
    EXPECT_EQ(marked.superseded().loaded_step(), 30);
    EXPECT_EQ(marked.superseded().reason(), "rank 0 loaded the state of step 30 at step 50");
    marked.clear_superseded();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(marked, original)) << step;
  }
  for (int64_t step : {10, 20, 30}) EXPECT_EQ(manifest_of(step), committed[step]) << step;

  // The steps run again: their reports are taken, and step 40's new checkpoint needs both ranks
  // again.
  for (int64_t step = 31; step <= 40; ++step) ASSERT_TRUE(Report(running, 0, step).ok()) << step;
  EXPECT_EQ(manager_->GetJob(job->id())->progress().step(), 40);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Commit(running, 1, 40).ok());
  EXPECT_FALSE(std::filesystem::exists(checkpoint::ManifestPath(checkpoint::StepDir(job_dir, 40))));
  ASSERT_TRUE(Commit(running, 0, 40).ok());
  after = *manager_->GetJob(job->id());
  EXPECT_EQ(after.latest_checkpoint().step(), 40);
  v1::CheckpointManifest again;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(manifest_of(40), &again).ok());
  EXPECT_GT(again.commit_time().seconds(), loaded.commit_time().seconds());
  EXPECT_FALSE(again.has_superseded());
  // Rank 1's old commit of step 60 was forgotten: rank 0's alone does not complete it.
  for (int64_t step = 41; step <= 60; ++step) ASSERT_TRUE(Report(running, 0, step).ok());
  ASSERT_TRUE(Commit(running, 0, 60).ok());
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 40);

  // A state from elsewhere (a torch-format dict) at step 20: the job's own step-20 checkpoint
  // holds another state and goes too.
  rewind.clear_loaded_job_id();
  rewind.clear_loaded_checkpoint();
  rewind.set_step(20);
  rewound = manager_->RewindJob(rewind);
  ASSERT_TRUE(rewound.ok()) << rewound.status();
  EXPECT_EQ(
      std::vector<int64_t>(rewound->superseded_steps().begin(), rewound->superseded_steps().end()),
      (std::vector<int64_t>{20, 30, 40}));
  EXPECT_EQ(manager_->GetJob(job->id())->latest_checkpoint().step(), 10);
  EXPECT_TRUE(
      std::filesystem::exists(absl::StrCat(job_dir, "/", checkpoint::SupersededDirName(40, 2))));
  // Each rewind left a NOTICE.
  std::vector<std::string> notices;
  for (const v1::JobEvent& event : Events(job->id())) {
    if (event.type() == v1::NOTICE && absl::StrContains(event.message(), "went back")) {
      notices.push_back(event.message());
    }
  }
  EXPECT_EQ(notices,
            (std::vector<std::string>{
                "rank 0: the job went back to step 30 (rank 0 loaded the state of step 30 at "
                "step 50); the checkpoints of steps 40, 50 are superseded (kept aside, marked so)",
                "rank 0: the job went back to step 20 (rank 0 loaded the state of step 30 at "
                "step 50); the checkpoints of steps 20, 30, 40 are superseded (kept aside, marked "
                "so)"}));

  // Only the current generation's ranks rewind.
  rewind.set_generation(running.generation() + 1);
  EXPECT_EQ(manager_->RewindJob(rewind).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Issue 36, row 2. Fails before the fix: rank 1's RewindJob(step 0) superseded every checkpoint
// of the job, a step past the job's progress was taken, and a built-in job's rank 0 could rewind
// its job too. Now only an attached job's rank 0 takes it back, and only to a step it reached;
// each refusal names its rule and changes nothing.
TEST_F(JobManagerTest, RewindJobTakesOnlyAnAttachedJobsRankZeroBackToAStepItReached) {
  RegisterAttachable("node-a");
  RegisterAttachable("node-b");
  v1::JobSpec spec = AttachedSpec({"node-a", "node-b"});
  spec.mutable_checkpoint()->set_keep(10);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job running = *manager_->GetJob(job->id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  const std::string job_dir =
      checkpoint::JobCheckpointDir(checkpoint_root_, running.spec().checkpoint().dir());
  for (int64_t step : {10, 20}) {
    for (int rank : {0, 1}) ASSERT_TRUE(Commit(running, rank, step).ok());
    ASSERT_TRUE(Report(running, 0, step).ok());
  }
  const size_t events_before = Events(job->id()).size();
  auto unchanged = [&] {
    const v1::Job now = *manager_->GetJob(job->id());
    EXPECT_EQ(now.latest_checkpoint().step(), 20);
    EXPECT_EQ(now.progress().step(), 20);
    for (int64_t step : {10, 20}) {
      EXPECT_TRUE(
          std::filesystem::exists(checkpoint::ManifestPath(checkpoint::StepDir(job_dir, step))))
          << step;
    }
    EXPECT_EQ(Events(job->id()).size(), events_before);
  };

  v1::RewindJobRequest rewind;
  rewind.set_worker_id(running.worker_ids(1));
  rewind.set_job_id(running.id());
  rewind.set_generation(running.generation());
  rewind.set_rank(1);
  rewind.set_step(0);
  const absl::Status rank_one = manager_->RewindJob(rewind).status();
  EXPECT_EQ(rank_one.code(), absl::StatusCode::kPermissionDenied) << rank_one;
  EXPECT_TRUE(absl::StrContains(rank_one.message(), "rank: 1")) << rank_one;
  EXPECT_TRUE(absl::StrContains(rank_one.message(), "only the job's rank 0")) << rank_one;
  unchanged();

  rewind.set_worker_id(running.worker_ids(0));
  rewind.set_rank(0);
  rewind.set_step(21);
  const absl::Status forward = manager_->RewindJob(rewind).status();
  EXPECT_EQ(forward.code(), absl::StatusCode::kFailedPrecondition) << forward;
  EXPECT_TRUE(absl::StrContains(forward.message(), "step: 21 is past")) << forward;
  EXPECT_TRUE(absl::StrContains(forward.message(), "progress (step 20)")) << forward;
  unchanged();

  // Its own rank 0, back to a step it reached: taken.
  rewind.set_step(10);
  absl::StatusOr<v1::RewindJobResponse> back = manager_->RewindJob(rewind);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::vector<int64_t>(back->superseded_steps().begin(), back->superseded_steps().end()),
            (std::vector<int64_t>{10, 20}));

  // A built-in job: no rank of it rewinds, rank 0 included.
  Register("builtin");
  auto builtin = manager_->SubmitJob(SeedSpec(1));
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  const v1::Job builtin_running = *manager_->GetJob(builtin->id());
  ASSERT_EQ(builtin_running.state(), v1::RUNNING);
  ASSERT_TRUE(Commit(builtin_running, 0, 1).ok());
  ASSERT_TRUE(Report(builtin_running, 0, 2).ok());
  v1::RewindJobRequest builtin_rewind;
  builtin_rewind.set_worker_id(builtin_running.worker_ids(0));
  builtin_rewind.set_job_id(builtin_running.id());
  builtin_rewind.set_generation(builtin_running.generation());
  builtin_rewind.set_rank(0);
  builtin_rewind.set_step(0);
  const absl::Status not_attached = manager_->RewindJob(builtin_rewind).status();
  EXPECT_EQ(not_attached.code(), absl::StatusCode::kFailedPrecondition) << not_attached;
  EXPECT_TRUE(absl::StrContains(not_attached.message(), "is not an attached job")) << not_attached;
  EXPECT_EQ(manager_->GetJob(builtin->id())->latest_checkpoint().step(), 1);
  EXPECT_EQ(manager_->GetJob(builtin->id())->progress().step(), 2);
}

TEST_F(JobManagerTest, SetStateRefusesEveryChangeOutsideTheTableAndChangesNothing) {
  const std::string a = Register("a");
  auto succeeded = manager_->SubmitJob(SeedSpec(1));
  auto pending = manager_->SubmitJob(SeedSpec(2));  // two workers: it waits
  ASSERT_TRUE(succeeded.ok() && pending.ok());
  ASSERT_TRUE(Finish(*manager_->GetJob(succeeded->id()), 0).ok());
  auto running = manager_->SubmitJob(SeedSpec(1));  // backfills onto a
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(manager_->GetJob(succeeded->id())->state(), v1::SUCCEEDED);
  ASSERT_EQ(manager_->GetJob(pending->id())->state(), v1::PENDING);
  ASSERT_EQ(manager_->GetJob(running->id())->state(), v1::RUNNING);

  struct Refused {
    std::string job_id;
    v1::JobState to;
  };
  const Refused refused_changes[] = {
      {succeeded->id(), v1::RUNNING}, {succeeded->id(), v1::FAILED},
      {pending->id(), v1::SUCCEEDED}, {pending->id(), v1::RECOVERING},
      {pending->id(), v1::PENDING},   {running->id(), v1::PENDING},
      {running->id(), v1::RUNNING},   {running->id(), v1::JOB_STATE_UNSPECIFIED},
  };
  for (const Refused& change : refused_changes) {
    const v1::Job before = *manager_->GetJob(change.job_id);
    SCOPED_TRACE(absl::StrCat(change.job_id, ": ", v1::JobState_Name(before.state()), " -> ",
                              v1::JobState_Name(change.to)));
    const size_t events_before = Events(change.job_id).size();
    const absl::Status refused = JobManagerTestPeer::SetState(*manager_, change.job_id, change.to);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_NE(refused.message().find(change.job_id), absl::string_view::npos) << refused;
    EXPECT_NE(refused.message().find(v1::JobState_Name(before.state())), absl::string_view::npos)
        << refused;
    EXPECT_NE(refused.message().find(v1::JobState_Name(change.to)), absl::string_view::npos)
        << refused;
    EXPECT_EQ(manager_->GetJob(change.job_id)->SerializeAsString(), before.SerializeAsString());
    EXPECT_EQ(Events(change.job_id).size(), events_before);
  }
  // The running job still runs: its worker keeps its assignment.
  EXPECT_EQ(Beat(a, running->id(), 1).kind(), v1::ASSIGNMENT_RUN);
  // The same peer call takes an edge that is in the table.
  ASSERT_TRUE(JobManagerTestPeer::SetState(*manager_, pending->id(), v1::CANCELLED).ok());
  EXPECT_EQ(manager_->GetJob(pending->id())->state(), v1::CANCELLED);
}

}  // namespace
}  // namespace zeroshard::coordinator
