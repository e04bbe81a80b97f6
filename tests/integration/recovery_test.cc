// Issue 12: a lost worker costs at most the steps since the last checkpoint. Real coordinator and
// worker processes on loopback: a worker kill -9'd mid-job is replaced by a spare and the job
// resumes from its latest committed checkpoint, ending with parameters bitwise equal to an
// uninterrupted run; without a spare the job shrinks and ends within 1e-6 of it, and its next
// generation has every survivor; a corrupt latest checkpoint is passed over (a NOTICE says so)
// for the previous one.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/manifest.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_credentials.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

constexpr absl::Duration kJobDeadline = absl::Seconds(240);
constexpr int64_t kEverySteps = 40;

LocalClusterOptions FastHeartbeats() {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(200);
  options.missed_heartbeats = 3;
  // The survivor is back within a few hundred milliseconds of a kill, but a loaded machine can
  // stretch that past the default wait (one period), which would add a NOTICE saying it was not
  // waited for.
  options.extra_coordinator_flags = {"--regroup_wait=10s"};
  return options;
}

// A model big enough that steps take milliseconds (the test stops a worker mid-job), small
// enough that its checkpoints are a few MB.
v1::JobSpec RecoverySpec(const std::string& name, int min_workers, int max_workers, int64_t steps,
                         int64_t every_steps = kEverySteps, v1::Mode mode = v1::ZERO2) {
  v1::JobSpec spec;
  spec.set_name(name);
  for (int64_t size : {128, 512, 512, 128}) spec.mutable_workload()->add_layer_sizes(size);
  spec.mutable_workload()->set_dataset_size(4096);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(1e-3);
  spec.set_mode(mode);
  spec.set_min_workers(min_workers);
  spec.set_max_workers(max_workers);
  spec.set_global_batch(96);
  spec.set_steps(steps);
  spec.set_seed(3);
  spec.mutable_checkpoint()->set_every_steps(every_steps);
  spec.mutable_checkpoint()->set_keep(3);
  spec.set_max_attempts(5);
  return spec;
}

absl::StatusOr<v1::Job> RunToEnd(LocalCluster& cluster, const v1::JobSpec& spec) {
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  if (!submitted.ok()) return submitted.status();
  return cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); },
      kJobDeadline, "ended");
}

// Every tensor's parameters in the job's final checkpoint (the one at spec.steps).
absl::StatusOr<std::vector<std::vector<float>>> FinalParameters(const LocalCluster& cluster,
                                                                const v1::Job& job) {
  absl::StatusOr<checkpoint::Directory> root =
      checkpoint::Directory::OpenRoot(cluster.checkpoint_root());
  if (!root.ok()) return root.status();
  absl::StatusOr<checkpoint::CheckpointListing> listing =
      checkpoint::ListCheckpoints(*root, job.spec().checkpoint().dir(), job.id());
  if (!listing.ok()) return listing.status();
  if (listing->committed.empty() || listing->committed.front().step != job.spec().steps()) {
    return absl::NotFoundError(absl::StrCat(job.id(), ": no final checkpoint"));
  }
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
      checkpoint::CheckpointReader::Open(listing->committed.front());
  if (!reader.ok()) return reader.status();
  std::vector<std::vector<float>> tensors;
  for (const v1::CheckpointTensor& tensor : (*reader)->header().tensors()) {
    int64_t elements = 1;
    for (int64_t dim : tensor.shape()) elements *= dim;
    std::vector<float>& values = tensors.emplace_back(elements);
    absl::Status read = (*reader)->Read("param", tensor.name(), 0, elements, values.data(),
                                        values.size() * sizeof(float));
    if (!read.ok()) return read;
  }
  return tensors;
}

// Per tensor, max |a - b| / max |a|: the largest over tensors.
double MaxRelativeDifference(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b) {
  double worst = 0.0;
  for (size_t t = 0; t < a.size(); ++t) {
    double diff = 0.0;
    double scale = 0.0;
    for (size_t e = 0; e < a[t].size(); ++e) {
      diff = std::max(diff, std::fabs(double{a[t][e]} - double{b[t][e]}));
      scale = std::max(scale, std::fabs(double{a[t][e]}));
    }
    worst = std::max(worst, scale > 0.0 ? diff / scale : diff);
  }
  return worst;
}

// Once `job` has committed a checkpoint at `min_checkpoint` or later: stops rank 1's worker
// (SIGSTOP: its peers block in their collectives, so no checkpoint completes any more), calls
// `while_stopped` with the job's latest checkpoint, then kills the worker. Returns that
// checkpoint's step.
absl::StatusOr<int64_t> StopAndKillRankOne(
    LocalCluster& cluster, const std::string& job_id, int64_t min_checkpoint,
    const std::function<void(const v1::CheckpointRecord&)>& while_stopped) {
  absl::StatusOr<v1::Job> running = cluster.WaitForJob(
      job_id,
      [&](const v1::Job& job) {
        return job.state() == v1::RUNNING && job.latest_checkpoint().step() >= min_checkpoint;
      },
      kJobDeadline, absl::StrCat("a checkpoint at step ", min_checkpoint, " or later"));
  if (!running.ok()) return running.status();
  absl::StatusOr<int> victim = cluster.WorkerIndexOf(running->worker_ids(1));
  if (!victim.ok()) return victim.status();
  if (absl::Status stopped = cluster.KillWorker(*victim, SIGSTOP); !stopped.ok()) return stopped;
  if (absl::Status stopped = cluster.WaitForWorkerStopped(*victim, absl::Seconds(10));
      !stopped.ok()) {
    return stopped;
  }
  absl::StatusOr<v1::Job> frozen = cluster.client().GetJob(job_id);
  if (!frozen.ok()) return frozen.status();
  if (frozen->state() != v1::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job ended before its worker was stopped: ", frozen->ShortDebugString()));
  }
  while_stopped(frozen->latest_checkpoint());
  if (absl::Status killed = cluster.KillWorker(*victim, SIGKILL); !killed.ok()) return killed;
  return frozen->latest_checkpoint().step();
}

// In zero2 and, issue 38 row 6, in zero3 (where the new generation's ranks load only their owned
// pieces of the parameters from the checkpoint). zero3 fails before the fix: mode ZERO3
// was refused at submission ("not implemented yet").
class SpareRecoveryTest : public ::testing::TestWithParam<v1::Mode> {};

TEST_P(SpareRecoveryTest, ASpareTakesOverFromTheLatestCheckpointBitwise) {
  const v1::Mode mode = GetParam();
  LocalCluster cluster(FastHeartbeats());
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.Start(3).ok());
  const v1::JobSpec spec = RecoverySpec("recovered", 2, 2, 600, kEverySteps, mode);
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<int64_t> resumed_at =
      StopAndKillRankOne(cluster, submitted->id(), 2 * kEverySteps, [](const auto&) {});
  ASSERT_TRUE(resumed_at.ok()) << resumed_at.status();
  // The next generation starts from that checkpoint, on the survivor and the spare.
  absl::StatusOr<v1::Job> second = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return job.generation() == 2; }, kJobDeadline,
      "generation 2");
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      submitted->id(),
      [](const v1::Job& job) { return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED; },
      kJobDeadline, "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_EQ(ended->generation(), 2);
  EXPECT_EQ(ended->latest_checkpoint().step(), 600);
  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  for (const v1::JobEvent& event : *events) {
    if (event.type() == v1::GENERATION_STARTED && event.generation() == 2) {
      EXPECT_EQ(event.worker_ids_size(), 2);
    }
  }

  // The engine ran the mode asked for: only zero3 has a gather pool.
  EXPECT_EQ(ended->progress().memory().gather_pool_bytes() > 0, mode == v1::ZERO3)
      << ended->progress().memory().ShortDebugString();

  absl::StatusOr<v1::Job> reference =
      RunToEnd(cluster, RecoverySpec("reference", 2, 2, 600, kEverySteps, mode));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->state(), v1::SUCCEEDED) << reference->message();
  absl::StatusOr<std::vector<std::vector<float>>> recovered = FinalParameters(cluster, *ended);
  absl::StatusOr<std::vector<std::vector<float>>> uninterrupted =
      FinalParameters(cluster, *reference);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  EXPECT_TRUE(*recovered == *uninterrupted)
      << "resumed from step " << *resumed_at << ": max relative difference "
      << MaxRelativeDifference(*uninterrupted, *recovered);
  EXPECT_TRUE(cluster.StopAll().ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, SpareRecoveryTest, ::testing::Values(v1::ZERO2, v1::ZERO3),
                         [](const ::testing::TestParamInfo<v1::Mode>& info) {
                           return absl::AsciiStrToLower(v1::Mode_Name(info.param));
                         });

// Issue 36, row 12: a worker lost after the job's last step (it stopped itself there, its reports
// in and its final checkpoint not written, the job still RUNNING; then kill -9, with TLS and
// tokens) costs no more steps than the bound the job's NOTICEs stated by then (the documented
// 2 * every_steps without one), and the job succeeds in its next generation. On this machine the
// checkpoints of this small model are written within a step or two, so this passed on the code
// before the fix too; CheckpointScheduleTest.AKillAfterTheLastStepRedoesNoMoreThanTheStatedBound
// reproduces the slow writes with which it did not (1,600 steps redone after "up to 1435").
TEST(RecoveryTest, AKillAfterTheLastStepRedoesNoMoreThanItsNoticesStated) {
  absl::StatusOr<ClusterCredentials> credentials =
      MakeClusterCredentials(absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  LocalClusterOptions options = FastHeartbeats();
  options.security = credentials->security;
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  absl::StatusOr<int> stopper =
      cluster.StartWorker("worker-0", {}, {"ZEROSHARD_TESTONLY_STOP_AFTER_LAST_STEP=1"});
  ASSERT_TRUE(stopper.ok()) << stopper.status();
  ASSERT_TRUE(cluster.StartWorker("worker-1").ok());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2, kJobDeadline).ok());
  constexpr int64_t kSteps = 5 * kEverySteps;
  absl::StatusOr<v1::Job> submitted =
      cluster.client().SubmitJob(RecoverySpec("last-step", 2, 2, kSteps));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_EQ(submitted->state(), v1::RUNNING) << submitted->message();
  ASSERT_TRUE(cluster.StartWorker("worker-2").ok());  // the spare

  ASSERT_TRUE(cluster.WaitForWorkerStopped(*stopper, kJobDeadline).ok());
  absl::StatusOr<v1::Job> stopped = cluster.client().GetJob(submitted->id());
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_NE(stopped->state(), v1::SUCCEEDED) << "the job ended before the kill";
  ASSERT_TRUE(cluster.KillWorker(*stopper, SIGKILL).ok());
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); },
      kJobDeadline, "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_EQ(ended->generation(), 2);

  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  int64_t reported = 0;   // generation 1's highest reported step
  int64_t committed = 0;  // its latest committed checkpoint: generation 2 resumes from it
  int64_t stated = 2 * kEverySteps;
  std::optional<int64_t> resumed;  // generation 2's first reported step, less one
  const std::regex bound(R"(a lost worker redoes up to (\d+) steps)");
  for (const v1::JobEvent& event : *events) {
    if (event.generation() == 1 && event.type() == v1::PROGRESS) {
      reported = std::max(reported, event.progress().step());
    } else if (event.generation() == 1 && event.type() == v1::CHECKPOINT_COMMITTED) {
      committed = std::max(committed, event.checkpoint().step());
    } else if (event.generation() == 1 && event.type() == v1::NOTICE) {
      std::smatch match;
      const std::string& message = event.message();
      if (std::regex_search(message, match, bound)) {
        stated = std::max<int64_t>(stated, std::stoll(match[1].str()));
      }
    } else if (event.generation() == 2 && event.type() == v1::PROGRESS && !resumed.has_value()) {
      resumed = event.progress().step() - 1;
    }
  }
  std::fprintf(stderr,
               "generation 1 reported step %lld, committed step %lld, stated %lld; generation 2 "
               "resumed from step %lld\n",
               static_cast<long long>(reported), static_cast<long long>(committed),
               static_cast<long long>(stated), static_cast<long long>(resumed.value_or(-1)));
  EXPECT_GE(reported, kSteps - 1);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(*resumed, committed);
  EXPECT_LE(reported - committed, stated)
      << "generation 1 reported step " << reported << "; generation 2 resumed from " << committed;
  EXPECT_TRUE(cluster.StopAll().ok());
}

TEST(RecoveryTest, WithoutASpareTheJobShrinksAndEndsWithinOneInAMillion) {
  LocalCluster cluster(FastHeartbeats());
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.Start(2).ok());
  // Checkpoints every 20 steps and the kill after the one at step 180: the last 20 steps run at
  // W = 1 (issue 12: "20 further steps match an uninterrupted run ... within 1e-6").
  // A larger batch makes steps slower, so that the stop lands in the last 20 steps' window.
  v1::JobSpec spec = RecoverySpec("shrunk", 1, 2, 200, 20);
  spec.set_global_batch(480);
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<int64_t> resumed_at =
      StopAndKillRankOne(cluster, submitted->id(), 180, [](const auto&) {});
  ASSERT_TRUE(resumed_at.ok()) << resumed_at.status();
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      submitted->id(),
      [](const v1::Job& job) { return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED; },
      kJobDeadline, "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_EQ(ended->generation(), 2);
  EXPECT_EQ(ended->worker_ids_size(), 1);

  // The uninterrupted run at W = 2, on the survivor and a new worker.
  absl::StatusOr<int> survivor = cluster.WorkerIndexOf(ended->worker_ids(0));
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  ASSERT_TRUE(cluster.StartWorker("worker-2").ok());
  ASSERT_TRUE(cluster
                  .WaitForWorkerStates({absl::StrCat("worker-", *survivor), "worker-2"}, v1::IDLE,
                                       absl::Seconds(30))
                  .ok());
  v1::JobSpec reference_spec = spec;
  reference_spec.set_name("reference");
  reference_spec.set_min_workers(2);
  absl::StatusOr<v1::Job> reference = RunToEnd(cluster, reference_spec);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->state(), v1::SUCCEEDED) << reference->message();
  absl::StatusOr<std::vector<std::vector<float>>> shrunk = FinalParameters(cluster, *ended);
  absl::StatusOr<std::vector<std::vector<float>>> uninterrupted =
      FinalParameters(cluster, *reference);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  const double difference = MaxRelativeDifference(*uninterrupted, *shrunk);
  EXPECT_LE(difference, 1e-6) << "resumed from step " << *resumed_at << " at W = 1";
  std::fprintf(stderr, "shrunk at step %lld: max relative difference %.3g\n",
               static_cast<long long>(*resumed_at), difference);
  EXPECT_TRUE(cluster.StopAll().ok());
}

TEST(RecoveryTest, WithoutASpareTheNextGenerationHasEverySurvivor) {
  // The killed worker's lease (30 s) and the regroup wait (20 s) are far longer than the test
  // lets the recovery take: only the survivors' reports of the dead rank end the wait early.
  LocalClusterOptions options;
  options.missed_heartbeats = 30;
  options.extra_coordinator_flags = {"--regroup_wait=20s"};
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.Start(4).ok());
  // Any W from 1 to 4 divides the global batch (96): the first survivor back would do.
  const v1::JobSpec spec = RecoverySpec("regrouped", 1, 4, 600);
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<v1::Job> first = cluster.WaitForJob(
      submitted->id(),
      [](const v1::Job& job) {
        return job.state() != v1::RUNNING || job.latest_checkpoint().step() >= kEverySteps;
      },
      kJobDeadline, "the first checkpoint");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->state(), v1::RUNNING) << first->message();
  ASSERT_EQ(first->worker_ids_size(), 4);
  constexpr int kVictimRank = 2;
  absl::StatusOr<int> victim = cluster.WorkerIndexOf(first->worker_ids(kVictimRank));
  ASSERT_TRUE(victim.ok()) << victim.status();
  ASSERT_TRUE(cluster.KillWorker(*victim, SIGKILL).ok());

  absl::StatusOr<v1::Job> second = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return job.generation() >= 2; }, absl::Seconds(10),
      "generation 2, within 10 s of the kill");
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      submitted->id(),
      [](const v1::Job& job) { return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED; },
      kJobDeadline, "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  EXPECT_EQ(ended->generation(), 2);
  EXPECT_EQ(ended->latest_checkpoint().step(), 600);
  std::vector<std::string> survivors;
  for (int rank = 0; rank < first->worker_ids_size(); ++rank) {
    if (rank != kVictimRank) survivors.push_back(first->worker_ids(rank));
  }
  std::vector<std::string> generation_two;
  std::vector<std::string> notices;
  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  for (const v1::JobEvent& event : *events) {
    if (event.type() == v1::GENERATION_STARTED && event.generation() == 2) {
      generation_two.assign(event.worker_ids().begin(), event.worker_ids().end());
    }
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  EXPECT_EQ(generation_two, survivors);
  EXPECT_TRUE(notices.empty()) << notices.front();
  EXPECT_TRUE(cluster.StopAll().ok());
}

TEST(RecoveryTest, ACorruptLatestCheckpointIsPassedOverForThePreviousOne) {
  LocalCluster cluster(FastHeartbeats());
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.Start(3).ok());
  const v1::JobSpec spec = RecoverySpec("corrupted", 2, 2, 600);
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::string corrupted_file;
  absl::StatusOr<int64_t> latest = StopAndKillRankOne(
      cluster, submitted->id(), 2 * kEverySteps, [&](const v1::CheckpointRecord& record) {
        // One byte of rank 0's file, near its end (fragment data, not the header).
        const std::string step_dir = checkpoint::StepDir(
            checkpoint::JobCheckpointDir(cluster.checkpoint_root(), submitted->id()),
            record.step());
        corrupted_file = step_dir + "/" + checkpoint::ShardFileName(0, 2);
        std::FILE* file = std::fopen(corrupted_file.c_str(), "r+b");
        ASSERT_NE(file, nullptr) << corrupted_file;
        ASSERT_EQ(std::fseek(file, -100, SEEK_END), 0);
        const int byte = std::fgetc(file);
        ASSERT_EQ(std::fseek(file, -100, SEEK_END), 0);
        std::fputc(byte ^ 0x5a, file);
        ASSERT_EQ(std::fclose(file), 0);
      });
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_FALSE(corrupted_file.empty());
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      submitted->id(),
      [](const v1::Job& job) { return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED; },
      kJobDeadline, "ended");
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  std::vector<std::string> notices;
  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  for (const v1::JobEvent& event : *events) {
    if (event.type() == v1::NOTICE) notices.push_back(event.message());
  }
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(absl::StrContains(notices[0], absl::StrCat("checkpoint at step ", *latest)))
      << notices[0];
  EXPECT_TRUE(absl::StrContains(notices[0], "DATA_LOSS")) << notices[0];
  EXPECT_TRUE(
      absl::StrContains(notices[0], absl::StrCat("resumed from step ", *latest - kEverySteps)))
      << notices[0];

  absl::StatusOr<v1::Job> reference = RunToEnd(cluster, RecoverySpec("reference", 2, 2, 600));
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<std::vector<std::vector<float>>> recovered = FinalParameters(cluster, *ended);
  absl::StatusOr<std::vector<std::vector<float>>> uninterrupted =
      FinalParameters(cluster, *reference);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  EXPECT_TRUE(*recovered == *uninterrupted);
  EXPECT_TRUE(cluster.StopAll().ok());
}

}  // namespace
}  // namespace zeroshard::testing
