// Tests for the FIFO gang scheduler: world-size choice, host contiguity, backfill and its bound,
// jobs pinned to their workers, and recovering jobs' former members (preferred, and held while
// the job regroups).
#include "coordinator/scheduler.h"

#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);

PendingJob Job(std::string id, int64_t min, int64_t max, int64_t batch,
               absl::Duration waited = absl::ZeroDuration()) {
  PendingJob job;
  job.job_id = std::move(id);
  job.min_workers = min;
  job.max_workers = max;
  job.global_batch = batch;
  job.pending_since = kNow - waited;
  return job;
}

std::vector<FreeWorker> Workers(int n, v1::DeviceKind kind = v1::CPU) {
  std::vector<FreeWorker> workers;
  for (int i = 0; i < n; ++i) {
    workers.push_back({"w" + std::to_string(i), "host-" + std::to_string(i % 2), kind});
  }
  return workers;
}

TEST(ChooseWorldSizeTest, LargestDivisorInRange) {
  EXPECT_EQ(ChooseWorldSize(Job("a", 1, 8, 128), 5), 4);
  EXPECT_EQ(ChooseWorldSize(Job("a", 1, 8, 128), 8), 8);
  EXPECT_EQ(ChooseWorldSize(Job("a", 3, 3, 128), 8), 0);
  EXPECT_EQ(ChooseWorldSize(Job("a", 2, 6, 12), 1), 0);
  EXPECT_EQ(ChooseWorldSize(Job("a", 2, 6, 12), 5), 4);
  EXPECT_EQ(ChooseWorldSize(Job("a", 1, 1, 7), 100), 1);
}

TEST(SchedulerTest, PlacesJobsInFifoOrderWithHostsContiguous) {
  const std::vector<Placement> placements =
      Schedule({Job("a", 2, 4, 128), Job("b", 2, 2, 128)}, Workers(6), kNow);
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].job_id, "a");
  // host-0 holds w0, w2, w4; host-1 holds w1, w3, w5.
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2", "w4", "w1"}));
  EXPECT_EQ(placements[1].worker_ids, (std::vector<std::string>{"w3", "w5"}));
}

TEST(SchedulerTest, DeviceKindsDoNotMix) {
  std::vector<FreeWorker> workers = Workers(2, v1::CUDA);
  PendingJob cpu_job = Job("cpu", 1, 2, 2);
  EXPECT_TRUE(Schedule({cpu_job}, workers, kNow).empty());
  PendingJob gpu_job = cpu_job;
  gpu_job.device_kind = v1::CUDA;
  EXPECT_EQ(Schedule({gpu_job}, workers, kNow).size(), 1u);
}

TEST(SchedulerTest, LaterJobBackfillsWhileTheHeadIsYoung) {
  const std::vector<Placement> placements = Schedule(
      {Job("big", 8, 8, 128, absl::Seconds(5)), Job("small", 2, 2, 128)}, Workers(4), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "small");
}

TEST(SchedulerTest, HeadThatWaitedTooLongReservesWorkers) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  EXPECT_TRUE(Schedule({Job("big", 8, 8, 128, absl::Seconds(30)), Job("small", 2, 2, 128)},
                       Workers(4), kNow, options)
                  .empty());
  // Once enough workers exist, the head starts first.
  const std::vector<Placement> placements =
      Schedule({Job("big", 8, 8, 128, absl::Seconds(31)), Job("small", 2, 2, 128)}, Workers(10),
               kNow, options);
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].job_id, "big");
  EXPECT_EQ(placements[0].worker_ids.size(), 8u);
}

PendingJob Pinned(std::string id, std::vector<std::string> worker_ids,
                  absl::Duration waited = absl::ZeroDuration()) {
  PendingJob job = Job(std::move(id), 1, 1, 1, waited);
  job.pinned_worker_ids = std::move(worker_ids);
  return job;
}

TEST(SchedulerTest, PinnedJobRunsOnItsWorkersInItsRankOrder) {
  // Rank order is the job's, not the hosts' or registration's.
  const std::vector<Placement> placements =
      Schedule({Pinned("attached", {"w3", "w0", "w5"})}, Workers(6), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "attached");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w3", "w0", "w5"}));
}

TEST(SchedulerTest, PinnedJobWaitsUntilEveryWorkerIsFree) {
  std::vector<FreeWorker> workers = Workers(4);
  // w9 is not free (busy, dead, or not registered), nor is a rank nobody registered as ("").
  EXPECT_TRUE(Schedule({Pinned("a", {"w1", "w9"})}, workers, kNow).empty());
  EXPECT_TRUE(Schedule({Pinned("a", {"w1", ""})}, workers, kNow).empty());
  // A worker of another device kind is not free for it.
  workers.push_back({"w9", "host-0", v1::CUDA});
  EXPECT_TRUE(Schedule({Pinned("a", {"w1", "w9"})}, workers, kNow).empty());
  PendingJob on_cuda = Pinned("a", {"w9"});
  on_cuda.device_kind = v1::CUDA;
  EXPECT_EQ(Schedule({on_cuda}, workers, kNow).size(), 1u);
}

TEST(SchedulerTest, PinnedAndUnpinnedJobsShareTheWorkers) {
  const std::vector<Placement> placements =
      Schedule({Job("first", 2, 2, 128), Pinned("pinned", {"w0", "w1"}), Job("third", 2, 2, 128),
                Pinned("late", {"w3"})},
               Workers(6), kNow);
  ASSERT_EQ(placements.size(), 3u);
  // "first" took w0 and w2 (host-0), so "pinned" waits; "third" gets the next free workers.
  EXPECT_EQ(placements[0].job_id, "first");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2"}));
  EXPECT_EQ(placements[1].job_id, "third");
  EXPECT_EQ(placements[1].worker_ids, (std::vector<std::string>{"w4", "w1"}));
  // "late" is behind both and its worker is still free.
  EXPECT_EQ(placements[2].job_id, "late");
  EXPECT_EQ(placements[2].worker_ids, (std::vector<std::string>{"w3"}));
}

TEST(SchedulerTest, PinnedWorkersTakenFirstAreSkippedByLaterJobs) {
  const std::vector<Placement> placements =
      Schedule({Pinned("pinned", {"w2", "w1"}), Job("any", 1, 4, 4)}, Workers(6), kNow);
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w2", "w1"}));
  // The other four, host-0's first: w0 and w4, then w3 and w5.
  EXPECT_EQ(placements[1].worker_ids, (std::vector<std::string>{"w0", "w4", "w3", "w5"}));
}

TEST(SchedulerTest, PinnedJobThatWaitedTooLongHoldsOnlyItsOwnWorkers) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  // w1 is free, w9 is not: while young, the pinned job lets a later job take w1.
  std::vector<Placement> placements =
      Schedule({Pinned("pinned", {"w1", "w9"}, absl::Seconds(29)), Job("any", 4, 4, 4)}, Workers(4),
               kNow, options);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "any");
  // After the wait it holds w1, but the kind stays open: a later job gets the other workers.
  placements = Schedule({Pinned("pinned", {"w1", "w9"}, absl::Seconds(30)), Job("any", 1, 4, 4)},
                        Workers(4), kNow, options);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "any");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2"}))
      << "w1 is held for the pinned job, w3 would make 3 workers, which do not divide 4";
}

TEST(SchedulerTest, PinnedJobWaitsBehindAnEarlierJobThatReservedItsKind) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  EXPECT_TRUE(Schedule({Job("big", 8, 8, 128, absl::Seconds(31)), Pinned("pinned", {"w0"})},
                       Workers(4), kNow, options)
                  .empty());
  // Another kind's reservation does not hold it.
  PendingJob big_on_cuda = Job("big", 8, 8, 128, absl::Seconds(31));
  big_on_cuda.device_kind = v1::CUDA;
  EXPECT_EQ(Schedule({big_on_cuda, Pinned("pinned", {"w0"})}, Workers(4), kNow, options).size(),
            1u);
}

PendingJob Recovering(std::string id, int64_t min, int64_t max, int64_t batch,
                      std::vector<std::string> former_members, bool regrouping) {
  PendingJob job = Job(std::move(id), min, max, batch);
  job.preferred_worker_ids = std::move(former_members);
  job.regrouping = regrouping;
  return job;
}

TEST(SchedulerTest, FormerMembersArePlacedBeforeOtherWorkersInHostOrder) {
  // Without a preference the job would get w0, w2 (host-0) and w1: w3 and w5 come first, and
  // the rank order still keeps each host's workers together.
  const std::vector<Placement> placements =
      Schedule({Recovering("back", 1, 3, 96, {"w5", "w3", "w9"}, false)}, Workers(6), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w3", "w5"}));
  // More former members than the job may take: the first ones in host order.
  const std::vector<Placement> capped =
      Schedule({Recovering("back", 1, 2, 96, {"w5", "w3", "w1"}, false)}, Workers(6), kNow);
  ASSERT_EQ(capped.size(), 1u);
  EXPECT_EQ(capped[0].worker_ids, (std::vector<std::string>{"w1", "w3"}));
}

TEST(SchedulerTest, ARegroupingJobStartsNothingAndHoldsItsFormerMembers) {
  // "later" could take every worker; the members already back (w1, w4) are held for "back".
  std::vector<Placement> placements = Schedule(
      {Recovering("back", 1, 4, 96, {"w1", "w4"}, true), Job("later", 1, 4, 4)}, Workers(6), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "later");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2", "w3", "w5"}));
  // An earlier job still comes first: FIFO order is not changed by regrouping.
  placements = Schedule({Job("earlier", 6, 6, 6), Recovering("back", 1, 4, 96, {"w1"}, true)},
                        Workers(6), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "earlier");
}

TEST(SchedulerTest, SchedulesAThousandWorkerJob) {
  const std::vector<Placement> placements =
      Schedule({Job("x", 1024, 1024, 1024)}, Workers(1500), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].worker_ids.size(), 1024u);
}

}  // namespace
}  // namespace zeroshard::coordinator
