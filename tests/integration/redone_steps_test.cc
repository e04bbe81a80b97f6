// Issue 24, item 6: a fast job (a small MLP at one to a few milliseconds per step, a checkpoint
// every 200 steps) that loses a worker (kill -9; a spare takes its place) redoes at most the bound
// docs/operations.md states: every_steps + S, where S is the number of steps trained while one
// checkpoint is written and committed, which is below every_steps for this job's tiny checkpoints
// (a checkpoint that takes longer defers the next one, and rank 0 states the bound it then gives
// in a NOTICE). Checked at the kill, and at every step rank 0 reported before it.
//
// On the code before the fix this test passed on the 2-core machine it was written on: there the
// writes took a few steps (never 200), so no checkpoint was skipped, and the coordinator recorded
// rank 0's reports as fast as training posted them. The same job with a checkpoint every 3 steps
// (writes longer than the interval) showed the old failure: a due checkpoint that found one rank's
// writer busy was skipped by that rank alone while the other wrote it, so neither completed.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(300);
constexpr int64_t kEverySteps = 200;
// Far more steps than the test runs: the job is cancelled once it resumed.
constexpr int64_t kSteps = 1000000;
// The kill comes once rank 0 reported this step (mid-interval) and a checkpoint was committed.
constexpr int64_t kKillAfterStep = 3100;

v1::JobSpec FastSpec() {
  v1::JobSpec spec;
  spec.set_name("fast");
  for (int64_t size : {32, 64, 32}) spec.mutable_workload()->add_layer_sizes(size);
  spec.mutable_workload()->set_dataset_size(4096);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(1e-3);
  spec.set_mode(v1::ZERO2);
  spec.set_min_workers(2);
  spec.set_max_workers(2);
  spec.set_global_batch(64);
  spec.set_steps(kSteps);
  spec.set_seed(5);
  spec.mutable_checkpoint()->set_every_steps(kEverySteps);
  spec.mutable_checkpoint()->set_keep(2);
  spec.set_max_attempts(3);
  return spec;
}

// The step a rank's run had reached when its generation ended, from its worker's log ("<job>
// generation G rank R aborted after step N", or "... failed after step N: ...").
std::optional<int64_t> StepReachedInLog(const std::string& log_path, const std::string& job_id,
                                        int64_t generation, int rank) {
  const std::regex pattern(absl::StrCat(job_id, " generation ", generation, " rank ", rank,
                                        R"( (aborted|failed) after step (\d+))"));
  std::ifstream log(log_path);
  std::optional<int64_t> reached;
  for (std::string line; std::getline(log, line);) {
    std::smatch match;
    int64_t step = 0;
    if (std::regex_search(line, match, pattern) && absl::SimpleAtoi(match[2].str(), &step)) {
      reached = step;
    }
  }
  return reached;
}

TEST(RedoneStepsTest, AFastJobRedoesAtMostEveryStepsPlusOneWrite) {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(200);
  options.missed_heartbeats = 3;
  options.extra_coordinator_flags = {"--regroup_wait=10s"};
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.Start(3).ok());
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(FastSpec());
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job_id = submitted->id();

  absl::StatusOr<v1::Job> running = cluster.WaitForJob(
      job_id,
      [](const v1::Job& job) {
        return job.state() != v1::RUNNING ||
               (job.progress().step() >= kKillAfterStep && job.has_latest_checkpoint());
      },
      kDeadline, absl::StrCat("step ", kKillAfterStep, " and a checkpoint"));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->message();
  ASSERT_EQ(running->generation(), 1);
  absl::StatusOr<int> survivor = cluster.WorkerIndexOf(running->worker_ids(0));
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  absl::StatusOr<int> victim = cluster.WorkerIndexOf(running->worker_ids(1));
  ASSERT_TRUE(victim.ok()) << victim.status();
  ASSERT_TRUE(cluster.KillWorker(*victim, SIGKILL).ok());

  // Generation 2 (the survivor and the spare) resumes and trains; then the job is cancelled, so
  // that its whole history can be read.
  absl::StatusOr<v1::Job> second = cluster.WaitForJob(
      job_id,
      [](const v1::Job& job) {
        return IsFinalJobState(job.state()) ||
               (job.generation() == 2 && job.state() == v1::RUNNING &&
                job.progress().step() > job.latest_checkpoint().step());
      },
      kDeadline, "generation 2 training");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->generation(), 2) << second->message();
  ASSERT_TRUE(cluster.client().CancelJob(job_id, "measured").ok());
  ASSERT_TRUE(cluster
                  .WaitForJob(
                      job_id, [](const v1::Job& job) { return IsFinalJobState(job.state()); },
                      kDeadline, "cancelled")
                  .ok());

  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(job_id);
  ASSERT_TRUE(events.ok()) << events.status();
  // Generation 1's history: its reports, the commits, and what a kill after each report would
  // have redone (the step reported minus the latest checkpoint committed by then).
  int64_t highest_reported = 0;
  int64_t committed = 0;  // the latest checkpoint: generation 2 resumes from it
  int64_t worst_gap = 0;
  int64_t worst_gap_at = 0;
  std::vector<int64_t> committed_steps;
  std::vector<std::string> notices;
  int64_t stated_bound = 0;  // the largest bound a deferral NOTICE stated
  const std::regex stated(R"(a lost worker redoes up to (\d+) steps)");
  bool second_started = false;
  for (const v1::JobEvent& event : *events) {
    if (event.type() == v1::GENERATION_STARTED && event.generation() == 2) second_started = true;
    if (second_started) continue;
    if (event.type() == v1::PROGRESS) {
      highest_reported = std::max(highest_reported, event.progress().step());
      if (event.progress().step() - committed > worst_gap) {
        worst_gap = event.progress().step() - committed;
        worst_gap_at = event.progress().step();
      }
    }
    if (event.type() == v1::CHECKPOINT_COMMITTED) {
      committed = event.checkpoint().step();
      committed_steps.push_back(committed);
    }
    if (event.type() == v1::NOTICE) {
      notices.push_back(event.message());
      std::smatch match;
      int64_t bound = 0;
      if (std::regex_search(notices.back(), match, stated) &&
          absl::SimpleAtoi(match[1].str(), &bound)) {
        stated_bound = std::max(stated_bound, bound);
      }
    }
  }
  ASSERT_TRUE(second_started);
  // The survivor may have run a step or so past its last report before it saw the kill.
  const std::optional<int64_t> reached = StepReachedInLog(
      cluster.worker_process(*survivor).log_path, job_id, /*generation=*/1, /*rank=*/0);
  ASSERT_TRUE(reached.has_value()) << "the survivor's log names no step reached";
  const int64_t redone_as_reported = highest_reported - committed;
  const int64_t redone = std::max(highest_reported, *reached) - committed;

  // Without a NOTICE the bound is 2 * every_steps (every write and commit took fewer than
  // every_steps steps, else the next due checkpoint would have found a writer busy). A NOTICE
  // states a larger one before any reported step passes the bound stated until then (issue 36:
  // before, a deferral NOTICE stated a bound that later, slower writes passed by up to half
  // again without a new NOTICE).
  const int64_t bound = std::max(2 * kEverySteps, stated_bound);
  std::fprintf(stderr,
               "generation 1 reported step %lld and reached step %lld; generation 2 resumed from "
               "step %lld: %lld steps redone (%lld as reported); the worst moment for a kill "
               "(step %lld) would have redone %lld; bound %lld; %zu checkpoints committed, %.3f ms "
               "per iteration at step %lld\n",
               static_cast<long long>(highest_reported), static_cast<long long>(*reached),
               static_cast<long long>(committed), static_cast<long long>(redone),
               static_cast<long long>(redone_as_reported), static_cast<long long>(worst_gap_at),
               static_cast<long long>(worst_gap), static_cast<long long>(bound),
               committed_steps.size(), running->progress().iteration_ms(),
               static_cast<long long>(running->progress().step()));
  for (const std::string& notice : notices) std::fprintf(stderr, "notice: %s\n", notice.c_str());
  const std::string context = absl::StrCat("committed: ", absl::StrJoin(committed_steps, ", "),
                                           "\nnotices:\n", absl::StrJoin(notices, "\n"));
  EXPECT_LE(redone, bound) << context;
  EXPECT_LE(worst_gap, bound) << "at step " << worst_gap_at << "\n" << context;
  EXPECT_TRUE(cluster.StopAll().ok());
}

}  // namespace
}  // namespace zeroshard::testing
