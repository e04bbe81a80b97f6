// The pinning policies' CPUs per rank, their names, and pinning the calling thread.
#include "worker/daemon/thread_placement.h"

#include <sched.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::worker {
namespace {

TEST(ThreadPinningTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (ThreadPinning pinning : {ThreadPinning::kNone, ThreadPinning::kTraining,
                                ThreadPinning::kShared, ThreadPinning::kSpread}) {
    absl::StatusOr<ThreadPinning> parsed = ParseThreadPinning(ThreadPinningName(pinning));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, pinning);
  }
  const absl::StatusOr<ThreadPinning> unknown = ParseThreadPinning("spreaded");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("thread_pinning"), absl::string_view::npos);
}

TEST(PlaceThreadsTest, NoneLeavesEveryThreadUnpinned) {
  const std::vector<int> cpus = {0, 1};
  const ThreadPlacement placement = PlaceThreads(ThreadPinning::kNone, 1, cpus);
  EXPECT_FALSE(placement.training_cpu.has_value());
  EXPECT_FALSE(placement.comm_cpu.has_value());
}

TEST(PlaceThreadsTest, TrainingPinsOnlyTheTrainingThreadOnTheRanksCpu) {
  const std::vector<int> cpus = {0, 1};
  for (int64_t rank = 0; rank < 3; ++rank) {
    const ThreadPlacement placement = PlaceThreads(ThreadPinning::kTraining, rank, cpus);
    EXPECT_EQ(placement.training_cpu, cpus[rank % 2]) << "rank " << rank;
    EXPECT_FALSE(placement.comm_cpu.has_value()) << "rank " << rank;
  }
}

TEST(PlaceThreadsTest, SharedPutsBothThreadsOfARankOnItsOwnCpu) {
  // Allowed CPUs need not start at 0 nor be contiguous.
  const std::vector<int> cpus = {2, 5, 7};
  for (int64_t rank = 0; rank < 4; ++rank) {
    const ThreadPlacement placement = PlaceThreads(ThreadPinning::kShared, rank, cpus);
    EXPECT_EQ(placement.training_cpu, cpus[rank % 3]) << "rank " << rank;
    EXPECT_EQ(placement.comm_cpu, cpus[rank % 3]) << "rank " << rank;
  }
}

TEST(PlaceThreadsTest, SpreadPutsTheCommunicationThreadOnTheNextRanksCpu) {
  const std::vector<int> cpus = {0, 1};
  const ThreadPlacement rank0 = PlaceThreads(ThreadPinning::kSpread, 0, cpus);
  const ThreadPlacement rank1 = PlaceThreads(ThreadPinning::kSpread, 1, cpus);
  EXPECT_EQ(rank0.training_cpu, 0);
  EXPECT_EQ(rank0.comm_cpu, 1);
  EXPECT_EQ(rank1.training_cpu, 1);
  EXPECT_EQ(rank1.comm_cpu, 0);
  // With one CPU there is nowhere else to go.
  const std::vector<int> one = {3};
  const ThreadPlacement alone = PlaceThreads(ThreadPinning::kSpread, 1, one);
  EXPECT_EQ(alone.training_cpu, 3);
  EXPECT_EQ(alone.comm_cpu, 3);
}

TEST(PinCurrentThreadTest, TheThreadThenRunsOnThatCpuAlone) {
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_FALSE(allowed->empty());
  const int cpu = allowed->back();
  // On a thread of its own, so that the test's main thread keeps its CPUs.
  absl::Status pinned;
  std::vector<int> after;
  std::thread thread([&] {
    pinned = PinCurrentThread(cpu);
    absl::StatusOr<std::vector<int>> now = AllowedCpus();
    if (now.ok()) after = *now;
  });
  thread.join();
  ASSERT_TRUE(pinned.ok()) << pinned;
  EXPECT_EQ(after, std::vector<int>{cpu});
  EXPECT_EQ(PinCurrentThread(-1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zeroshard::worker
