// Tests for the SQLite job store: round trips, reopening, atomicity of a save.
#include "coordinator/job_store.h"

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

using ::google::protobuf::util::MessageDifferencer;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

v1::Job MakeJob(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_name("demo");
  job.mutable_spec()->mutable_optimizer()->set_kind(v1::ADAMW);
  job.set_generation(2);
  job.add_worker_ids("worker-000001");
  return job;
}

v1::JobEvent MakeEvent(const std::string& job_id, int64_t sequence) {
  v1::JobEvent event;
  event.set_job_id(job_id);
  event.set_sequence(sequence);
  event.set_type(v1::STATE_CHANGED);
  event.set_state(v1::RUNNING);
  return event;
}

TEST(JobStoreTest, JobsAndEventsSurviveReopening) {
  const std::string dir = TempDir("reopen");
  const v1::Job a = MakeJob("job-000001", v1::RUNNING);
  const v1::Job b = MakeJob("job-000002", v1::PENDING);
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    const v1::Job* jobs[] = {&b, &a};
    ASSERT_TRUE((*store)
                    ->Save(jobs, {MakeEvent("job-000001", 1), MakeEvent("job-000001", 2),
                                  MakeEvent("job-000002", 1)})
                    .ok());
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_TRUE(MessageDifferencer::Equals((*jobs)[0], a));
  EXPECT_TRUE(MessageDifferencer::Equals((*jobs)[1], b));
  auto events = (*store)->LoadEvents("job-000001");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].sequence(), 2);
  EXPECT_EQ((*store)->LoadEvents("job-000009")->size(), 0u);
}

TEST(JobStoreTest, EventsArePagedBySequence) {
  auto store = JobStore::Open(TempDir("paged"));
  ASSERT_TRUE(store.ok());
  std::vector<v1::JobEvent> events;
  for (int64_t sequence = 1; sequence <= 10; ++sequence) {
    events.push_back(MakeEvent("job-000001", sequence));
  }
  events.push_back(MakeEvent("job-000002", 1));
  ASSERT_TRUE((*store)->Save({}, events).ok());
  auto page = (*store)->LoadEvents("job-000001", 4, 3);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].sequence(), 5);
  EXPECT_EQ((*page)[2].sequence(), 7);
  EXPECT_EQ((*store)->LoadEvents("job-000001", 8, 3)->size(), 2u);
  EXPECT_EQ((*store)->LoadEvents("job-000001", 10, 3)->size(), 0u);
  auto count = (*store)->CountEvents("job-000001");
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(count->events, 10);
  EXPECT_EQ(count->last_sequence, 10);
  EXPECT_EQ((*store)->CountEvents("job-000009")->last_sequence, 0);
}

TEST(JobStoreTest, ThinningDeletesEverySecondProgressEventOfTheOldestHalf) {
  auto store = JobStore::Open(TempDir("thin"));
  ASSERT_TRUE(store.ok());
  // 20 events: sequences 1, 6, 11 and 16 are state changes, the rest PROGRESS.
  std::vector<v1::JobEvent> events;
  for (int64_t sequence = 1; sequence <= 20; ++sequence) {
    v1::JobEvent event = MakeEvent("job-000001", sequence);
    if (sequence % 5 != 1) event.set_type(v1::PROGRESS);
    events.push_back(event);
  }
  events.push_back(MakeEvent("job-000002", 1));
  ASSERT_TRUE((*store)->Save({}, events).ok());
  // The oldest half is sequences 1-10; its PROGRESS events are 2 3 4 5 7 8 9 10, and every
  // second one of them goes: 3 5 8 10.
  auto deleted = (*store)->ThinProgressEvents("job-000001");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 4);
  auto stored = (*store)->LoadEvents("job-000001");
  ASSERT_TRUE(stored.ok()) << stored.status();
  std::vector<int64_t> kept;
  for (const v1::JobEvent& event : *stored) kept.push_back(event.sequence());
  EXPECT_EQ(kept, (std::vector<int64_t>{1, 2, 4, 6, 7, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}));
  // Other jobs are untouched.
  EXPECT_EQ((*store)->LoadEvents("job-000002")->size(), 1u);
}

TEST(JobStoreTest, SaveReplacesAJob) {
  auto store = JobStore::Open(TempDir("replace"));
  ASSERT_TRUE(store.ok());
  v1::Job job = MakeJob("job-000001", v1::PENDING);
  const v1::Job* jobs[] = {&job};
  ASSERT_TRUE((*store)->Save(jobs, {}).ok());
  job.set_state(v1::SUCCEEDED);
  ASSERT_TRUE((*store)->Save(jobs, {}).ok());
  auto loaded = (*store)->LoadJobs();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].state(), v1::SUCCEEDED);
}

TEST(JobStoreTest, RunAssignmentsAreReplacedPerJobAndSurviveReopening) {
  const std::string dir = TempDir("run-assignments");
  v1::Assignment first;
  first.set_kind(v1::ASSIGNMENT_RUN);
  first.set_job_id("job-000002");
  first.set_generation(1);
  first.set_world_size(2);
  first.set_plan_layout_hash(77);
  first.set_start_step(0);
  v1::Assignment next = first;
  next.set_generation(2);
  next.set_start_step(40);
  next.mutable_resume_from()->set_step(40);
  v1::Assignment other = first;
  other.set_job_id("job-000001");
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    const v1::Job job = MakeJob("job-000002", v1::RUNNING);
    const v1::Job* jobs[] = {&job};
    const v1::Assignment* saved[] = {&first, &other};
    ASSERT_TRUE((*store)->Save(jobs, {}, saved).ok());
    const v1::Assignment* replaced[] = {&next};
    ASSERT_TRUE((*store)->Save({}, {}, replaced).ok());
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->LoadRunAssignments();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_TRUE(MessageDifferencer::Equals((*loaded)[0], other));
  EXPECT_TRUE(MessageDifferencer::Equals((*loaded)[1], next));
}

TEST(JobStoreTest, CheckpointCommitsAreIdempotentPerRank) {
  auto store = JobStore::Open(TempDir("commits"));
  ASSERT_TRUE(store.ok());
  v1::CommitCheckpointRequest commit;
  commit.set_job_id("job-000001");
  commit.set_generation(1);
  commit.set_step(10);
  for (int rank : {1, 0, 1}) {
    commit.set_rank(rank);
    commit.set_path("job-000001/step-10/rank-" + std::to_string(rank));
    ASSERT_TRUE((*store)->SaveCheckpointCommit(commit).ok());
  }
  auto commits = (*store)->LoadCheckpointCommits("job-000001", 1, 10);
  ASSERT_TRUE(commits.ok());
  ASSERT_EQ(commits->size(), 2u);
  EXPECT_EQ((*commits)[0].rank(), 0);
  EXPECT_EQ((*store)->LoadCheckpointCommits("job-000001", 1, 11)->size(), 0u);
}

// Issue 27: a job that went back forgets its commits of the steps it will checkpoint again (of
// its generation only), so that an old rank's commit cannot complete a new checkpoint.
TEST(JobStoreTest, DeletedCheckpointCommitsAreThoseOfTheGenerationFromTheStep) {
  auto store = JobStore::Open(TempDir("commits-deleted"));
  ASSERT_TRUE(store.ok());
  v1::CommitCheckpointRequest commit;
  commit.set_job_id("job-000001");
  for (const auto& [generation, step] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 20}, {1, 30}, {1, 40}, {1, 50}, {2, 40}}) {
    commit.set_generation(generation);
    commit.set_step(step);
    commit.set_rank(0);
    ASSERT_TRUE((*store)->SaveCheckpointCommit(commit).ok());
  }
  commit.set_job_id("job-000002");
  commit.set_generation(1);
  ASSERT_TRUE((*store)->SaveCheckpointCommit(commit).ok());
  absl::StatusOr<int64_t> deleted = (*store)->DeleteCheckpointCommits("job-000001", 1, 40);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);
  EXPECT_EQ((*store)->LoadCheckpointCommits("job-000001", 1, 30)->size(), 1u);
  EXPECT_EQ((*store)->LoadCheckpointCommits("job-000001", 1, 40)->size(), 0u);
  EXPECT_EQ((*store)->LoadCheckpointCommits("job-000001", 1, 50)->size(), 0u);
  EXPECT_EQ((*store)->LoadCheckpointCommits("job-000001", 2, 40)->size(), 1u);
  EXPECT_EQ((*store)->LoadCheckpointCommits("job-000002", 1, 40)->size(), 1u);
}

TEST(JobStoreTest, ReservedWorkerNumbersNeverRepeatAcrossReopening) {
  const std::string dir = TempDir("worker-numbers");
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->ReserveWorkerNumbers(10), 1);
    EXPECT_EQ(*(*store)->ReserveWorkerNumbers(5), 11);
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->ReserveWorkerNumbers(10), 16);
}

// Issue 36, row 1: the holders of worker names survive a restart (the coordinator gives a known
// name only to its holder); a name's row is replaced by its next holder, and forgotten ones go.
TEST(JobStoreTest, WorkerNameHoldersAreReplacedForgottenAndSurviveReopening) {
  const std::string dir = TempDir("worker-names");
  security::Sha256Digest first{}, second{};
  first[0] = 1;
  second[0] = 2;
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveWorkerNames({{"a", "worker-000001", first}}).ok());
    ASSERT_TRUE((*store)->SaveWorkerNames({{"b", "worker-000002", first}}).ok());
    ASSERT_TRUE((*store)->SaveWorkerNames({{"a", "worker-000003", second}}, {"b"}).ok());
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<WorkerNameHolder>> names = (*store)->LoadWorkerNames();
  ASSERT_TRUE(names.ok()) << names.status();
  ASSERT_EQ(names->size(), 1u);
  EXPECT_EQ((*names)[0].name, "a");
  EXPECT_EQ((*names)[0].worker_id, "worker-000003");
  EXPECT_EQ((*names)[0].secret_sha256, second);
}

TEST(JobStoreTest, UnusableStateDirIsAnErrorNamingTheFlag) {
  const std::string file = TempDir("not-a-dir");
  std::filesystem::create_directories(std::filesystem::path(file).parent_path());
  { std::ofstream(file) << "x"; }
  auto store = JobStore::Open(file + "/sub");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("state_dir"), absl::string_view::npos);
}

}  // namespace
}  // namespace zeroshard::coordinator
