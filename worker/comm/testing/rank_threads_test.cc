// RunOnRankThreads: every rank runs once, on its own thread, concurrently with the others; a
// failing rank is named in the result, and the call returns only after every rank has returned.
#include "worker/comm/testing/rank_threads.h"

#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace zeroshard::comm::testing {
namespace {

// Far beyond how long starting a handful of threads takes; only a broken harness waits this long.
constexpr absl::Duration kDeadline = absl::Seconds(30);

// What the ranks of one run record. Thread contract: every member is read and written under mu.
struct RankRecord {
  explicit RankRecord(int world_size) : calls(world_size, 0) {}

  // Counts `rank` as arrived and waits (up to kDeadline) until `expected` ranks have: only
  // ranks running at the same time all get past it.
  absl::Status ArriveAndAwait(int rank, int expected) {
    absl::MutexLock lock(&mu);
    ++calls[rank];
    threads.insert(std::this_thread::get_id());
    ++arrived;
    auto all_arrived = [this, expected]()
                           ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return arrived >= expected; };
    if (!mu.AwaitWithTimeout(absl::Condition(&all_arrived), kDeadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank, " saw ", arrived, " of ", expected, " ranks arrive"));
    }
    return absl::OkStatus();
  }

  absl::Mutex mu;
  std::vector<int> calls ABSL_GUARDED_BY(mu);  // calls[r]: how often rank r's body ran
  std::set<std::thread::id> threads ABSL_GUARDED_BY(mu);
  int arrived ABSL_GUARDED_BY(mu) = 0;
  bool failing_rank_returning ABSL_GUARDED_BY(mu) = false;
  std::vector<int> finished ABSL_GUARDED_BY(mu);  // ranks whose body got to its last statement
};

TEST(RankThreadsTest, EveryRankRunsOnceOnItsOwnThreadConcurrently) {
  for (int world_size : {1, 2, 5}) {
    SCOPED_TRACE(absl::StrCat("world_size ", world_size));
    RankRecord record(world_size);
    const absl::Status status = RunOnRankThreads(
        world_size, [&](int rank) { return record.ArriveAndAwait(rank, world_size); });
    EXPECT_TRUE(status.ok()) << status;
    absl::MutexLock lock(&record.mu);
    EXPECT_EQ(record.calls, std::vector<int>(world_size, 1));
    EXPECT_EQ(record.threads.size(), static_cast<size_t>(world_size));
    EXPECT_EQ(record.threads.count(std::this_thread::get_id()), 0u);
  }
}

TEST(RankThreadsTest, AFailingRankIsNamedAndEveryRankStillRuns) {
  constexpr int kWorldSize = 4;
  constexpr int kFailingRank = 2;
  RankRecord record(kWorldSize);
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    // All ranks are under way before the failing one returns, so its failure cannot stop
    // another from starting.
    absl::Status arrived = record.ArriveAndAwait(rank, kWorldSize);
    if (!arrived.ok()) return arrived;
    if (rank == kFailingRank) return absl::NotFoundError("no peer address");
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_EQ(status.message(), absl::StrCat("rank ", kFailingRank, ": no peer address"));
  absl::MutexLock lock(&record.mu);
  EXPECT_EQ(record.calls, std::vector<int>(kWorldSize, 1));
}

TEST(RankThreadsTest, ReturnsOnlyOnceEveryRankHasReturned) {
  constexpr int kWorldSize = 3;
  constexpr int kFailingRank = 1;
  RankRecord record(kWorldSize);
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    absl::MutexLock lock(&record.mu);
    if (rank == kFailingRank) {
      record.failing_rank_returning = true;
      return absl::InternalError("lost the connection");
    }
    // The other ranks finish only after the failing rank has returned, so a harness that
    // returned at the first failure would come back before they are recorded.
    auto failed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(record.mu) {
      return record.failing_rank_returning;
    };
    if (!record.mu.AwaitWithTimeout(absl::Condition(&failed), kDeadline)) {
      return absl::DeadlineExceededError("the failing rank never ran");
    }
    record.finished.push_back(rank);
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_EQ(status.message(), absl::StrCat("rank ", kFailingRank, ": lost the connection"));
  absl::MutexLock lock(&record.mu);
  EXPECT_EQ(record.finished.size(), static_cast<size_t>(kWorldSize - 1));
}

TEST(RankThreadsTest, SeveralFailuresAreNamedInRankOrderWithTheLowestRanksCode) {
  constexpr int kWorldSize = 5;
  const absl::Status status = RunOnRankThreads(kWorldSize, [](int rank) -> absl::Status {
    if (rank == 1) return absl::DeadlineExceededError("timed out");
    if (rank == 3) return absl::AbortedError("aborted by a peer");
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(status.message(), "rank 1: timed out; rank 3: aborted by a peer");
}

TEST(RankThreadsTest, RefusesAnEmptyGroup) {
  bool ran = false;
  const absl::Status status = RunOnRankThreads(0, [&](int) {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace zeroshard::comm::testing
