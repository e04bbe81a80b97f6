// Tests for the FIFO gang scheduler: world-size choice, host contiguity, backfill and its bound.
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

TEST(SchedulerTest, SchedulesAThousandWorkerJob) {
  const std::vector<Placement> placements =
      Schedule({Job("x", 1024, 1024, 1024)}, Workers(1500), kNow);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].worker_ids.size(), 1024u);
}

}  // namespace
}  // namespace zeroshard::coordinator
