// Issue 12, "Bad states get a clear event": a full disk fails that checkpoint only. One worker
// runs under a file-size limit (RLIMIT_FSIZE, set by prlimit) smaller than its shard file, so
// every write of its checkpoints ends in EFBIG; the job must still succeed, with a NOTICE per
// checkpoint naming the error, nothing committed and no partial file left behind.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

constexpr int64_t kSteps = 60;
constexpr int64_t kEverySteps = 15;
// Each rank's shard of the model below is about 2.4 MB (its half of the parameters and of
// AdamW's two moments, fp32); the limit lets the worker's log grow but no shard file finish.
constexpr int64_t kFileSizeLimitBytes = int64_t{1} << 20;

v1::JobSpec FullDiskSpec() {
  v1::JobSpec spec;
  spec.set_name("full-disk");
  for (int64_t size : {128, 512, 512, 128}) spec.mutable_workload()->add_layer_sizes(size);
  spec.mutable_workload()->set_dataset_size(4096);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(1e-3);
  spec.set_mode(v1::ZERO2);
  spec.set_min_workers(2);
  spec.set_max_workers(2);
  spec.set_global_batch(96);
  spec.set_steps(kSteps);
  spec.set_seed(5);
  spec.mutable_checkpoint()->set_every_steps(kEverySteps);
  spec.mutable_checkpoint()->set_keep(2);
  return spec;
}

TEST(FullDiskTest, AFullDiskFailsThatCheckpointOnlyAndTheJobGoesOn) {
  LocalCluster cluster;
  LogTailsOnFailure log_tails(cluster);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  // worker-0 registers first, so it is rank 0 and the limited worker rank 1 (ranks follow
  // registration order on one host), as the checks below expect.
  ASSERT_TRUE(cluster.StartWorker("worker-0").ok());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1, absl::Seconds(30)).ok());
  absl::StatusOr<int> limited = cluster.StartWorker(
      "worker-1", {}, {},
      {"/usr/bin/prlimit", absl::StrCat("--fsize=", kFileSizeLimitBytes), "--"});
  ASSERT_TRUE(limited.ok()) << limited.status();
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2, absl::Seconds(30)).ok());
  absl::StatusOr<v1::WorkerInfo> limited_info = cluster.FindWorker("worker-1");
  ASSERT_TRUE(limited_info.ok()) << limited_info.status();

  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(FullDiskSpec());
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::Job job;
  ASSERT_TRUE(cluster
                  .WaitFor(
                      [&] {
                        absl::StatusOr<v1::Job> seen = cluster.client().GetJob(submitted->id());
                        if (!seen.ok()) return false;
                        job = *seen;
                        return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
                               job.state() == v1::CANCELLED;
                      },
                      absl::Seconds(120), "the job ended")
                  .ok());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.message();
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.progress().step(), kSteps);
  ASSERT_EQ(job.worker_ids_size(), 2);
  ASSERT_EQ(job.worker_ids(1), limited_info->id()) << "the limited worker must be rank 1";
  EXPECT_FALSE(job.has_latest_checkpoint()) << job.latest_checkpoint().ShortDebugString();
  // SIGXFSZ is ignored: the limited worker lived through every failed write.
  EXPECT_TRUE(cluster.worker_process(*limited).running());

  std::vector<v1::JobEvent> events;
  ASSERT_TRUE(
      cluster.client()
          .WatchJob(submitted->id(), 0, [&](const v1::JobEvent& event) { events.push_back(event); })
          .ok());
  // Every due checkpoint (the last one, at the final step, is always written) failed on rank 1
  // with the file-size error. One due while rank 1 was still writing (and failing) the previous
  // one is deferred to the first step at which every writer is free (checkpoint_schedule.h): its
  // NOTICE names that step, before the next due one.
  std::set<int64_t> rank_one_outcomes;  // by due step
  std::set<int64_t> rank_one_failures;  // by the step written
  for (const v1::JobEvent& event : events) {
    EXPECT_NE(event.type(), v1::CHECKPOINT_COMMITTED) << event.ShortDebugString();
    if (event.type() != v1::NOTICE) continue;
    for (int64_t step = kEverySteps; step <= kSteps; ++step) {
      const std::string prefix = absl::StrCat("checkpoint at step ", step, " ");
      if (absl::StartsWith(event.message(), absl::StrCat(prefix, "failed on rank 1: "))) {
        EXPECT_TRUE(absl::StrContains(event.message(), "File too large")) << event.message();
        if (step == kSteps)
          std::fprintf(stderr, "the final one's NOTICE: %s\n", event.message().c_str());
        rank_one_failures.insert(step);
        rank_one_outcomes.insert(step / kEverySteps * kEverySteps);
      } else if (absl::StartsWith(event.message(), absl::StrCat(prefix, "failed on rank 0"))) {
        ADD_FAILURE() << "rank 0 has no limit: " << event.message();
      }
    }
  }
  EXPECT_EQ(rank_one_outcomes.size(), static_cast<size_t>(kSteps / kEverySteps));
  EXPECT_EQ(rank_one_failures.count(kSteps), 1u);

  // Nothing committed, and nothing of rank 1's on disk: no shard file, no temporary file. What
  // is left is rank 0's files, which only a later committed checkpoint's pruning removes.
  const std::string job_dir =
      checkpoint::JobCheckpointDir(cluster.checkpoint_root(), job.spec().checkpoint().dir());
  absl::StatusOr<checkpoint::Directory> root =
      checkpoint::Directory::OpenRoot(cluster.checkpoint_root());
  ASSERT_TRUE(root.ok()) << root.status();
  absl::StatusOr<checkpoint::CheckpointListing> listing =
      checkpoint::ListCheckpoints(*root, job.spec().checkpoint().dir(), job.id());
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_TRUE(listing->committed.empty());
  ASSERT_TRUE(std::filesystem::is_directory(job_dir)) << job_dir;
  const std::string rank_zero_file = checkpoint::ShardFileName(0, 2);
  std::set<int64_t> steps_with_rank_zero_file;
  for (const std::filesystem::directory_entry& step_dir :
       std::filesystem::directory_iterator(job_dir)) {
    const std::optional<int64_t> step =
        checkpoint::ParseStepDirName(step_dir.path().filename().string());
    ASSERT_TRUE(step.has_value()) << step_dir.path();
    for (const std::filesystem::directory_entry& file :
         std::filesystem::directory_iterator(step_dir.path())) {
      EXPECT_EQ(file.path().filename().string(), rank_zero_file) << file.path();
      if (file.path().filename().string() == rank_zero_file)
        steps_with_rank_zero_file.insert(*step);
    }
  }
  EXPECT_EQ(steps_with_rank_zero_file.count(kSteps), 1u);
  EXPECT_TRUE(cluster.StopAll().ok());
}

}  // namespace
}  // namespace zeroshard::testing
