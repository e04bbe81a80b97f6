// Tests for JobEventLog alone, over a real SQLite JobStore: events reach watchers only once
// durable, sequences continue the stored history, a page of history hands over to following
// without a gap or a repeat, ended jobs end their watchers, closed watchers are dropped, and
// PROGRESS events are thinned past the bound.
#include "coordinator/job_event_log.h"

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/test_rpc_support.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

// Records what it is sent; closes itself after `accept` events when accept >= 0.
class RecordingSink : public JobEventSink {
 public:
  explicit RecordingSink(int accept = -1) : accept_(accept) {}
  bool OnEvent(const v1::JobEvent& event) override {
    if (accept_ >= 0 && static_cast<int>(sequences.size()) >= accept_) return false;
    sequences.push_back(event.sequence());
    return true;
  }
  void OnJobEnded() override { ++ended; }

  std::vector<int64_t> sequences;
  int ended = 0;

 private:
  const int accept_;
};

v1::JobEvent Progress(int64_t step) {
  v1::JobEvent event;
  event.set_type(v1::PROGRESS);
  event.mutable_progress()->set_step(step);
  return event;
}

class JobEventLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(FreshTestDir());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // What the job manager does after changing jobs: save the log's new events, then tell it.
  void Save(JobEventLog& log, const absl::flat_hash_set<std::string>& ended = {}) {
    ASSERT_TRUE(store_->Save({}, log.unpersisted()).ok());
    log.Persisted(ended);
  }

  common::FakeClock clock_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(JobEventLogTest, WatchersSeeEventsOnlyOnceDurableNumberedAfterTheStoredHistory) {
  JobEventLog log(&clock_, store_.get(), /*max_events_per_job=*/1000);
  // A job whose history (sequences 1..7) an earlier coordinator stored.
  log.AddJob("job-1", /*last_sequence=*/7, /*stored_events=*/7);
  auto sink = std::make_shared<RecordingSink>();
  absl::StatusOr<WatchPosition> page = log.WatchPage("job-1", 7, 100, false, sink);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->following);
  EXPECT_EQ(page->last_sequence, 7);

  const v1::JobEvent& added = log.Add("job-1", Notice(1, "hello"));
  EXPECT_EQ(added.sequence(), 8);
  EXPECT_EQ(added.job_id(), "job-1");
  EXPECT_EQ(added.type(), v1::NOTICE);
  log.Add("job-1", Progress(1));
  ASSERT_EQ(log.unpersisted().size(), 2u);
  // Not yet saved: nothing reached the watcher.
  EXPECT_TRUE(sink->sequences.empty());

  Save(log);
  EXPECT_EQ(sink->sequences, (std::vector<int64_t>{8, 9}));
  EXPECT_TRUE(log.unpersisted().empty());
  EXPECT_EQ(sink->ended, 0);
}

TEST_F(JobEventLogTest, APageOfHistoryHandsOverToFollowingWithoutAGapOrARepeat) {
  JobEventLog log(&clock_, store_.get(), 1000);
  log.AddJob("job-1", 0, 0);
  for (int step = 1; step <= 5; ++step) log.Add("job-1", Progress(step));
  Save(log);

  auto sink = std::make_shared<RecordingSink>();
  // A full page: the watcher is not following yet.
  absl::StatusOr<WatchPosition> first = log.WatchPage("job-1", 0, 3, false, sink);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->following);
  EXPECT_EQ(first->last_sequence, 3);
  // An event lands between the pages.
  log.Add("job-1", Progress(6));
  Save(log);
  // Another full page (4..6): still paging.
  absl::StatusOr<WatchPosition> second =
      log.WatchPage("job-1", first->last_sequence, 3, false, sink);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->following);
  EXPECT_EQ(second->last_sequence, 6);
  // The short (here empty) page ends the paging: the sink follows from there.
  absl::StatusOr<WatchPosition> third =
      log.WatchPage("job-1", second->last_sequence, 3, false, sink);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(third->following);
  EXPECT_EQ(third->last_sequence, 6);
  log.Add("job-1", Progress(7));
  Save(log);
  EXPECT_EQ(sink->sequences, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(log.watchers(), 1);
}

TEST_F(JobEventLogTest, EndedJobsEndTheirWatchersAndClosedWatchersAreDropped) {
  JobEventLog log(&clock_, store_.get(), 1000);
  log.AddJob("job-1", 0, 0);
  log.AddJob("job-2", 0, 0);
  auto ending = std::make_shared<RecordingSink>();
  auto closing = std::make_shared<RecordingSink>(/*accept=*/1);
  auto other = std::make_shared<RecordingSink>();
  ASSERT_TRUE(log.WatchPage("job-1", 0, 10, false, ending).ok());
  ASSERT_TRUE(log.WatchPage("job-1", 0, 10, false, closing).ok());
  ASSERT_TRUE(log.WatchPage("job-2", 0, 10, false, other).ok());
  EXPECT_EQ(log.watchers(), 3);

  log.Add("job-1", Progress(1));
  log.Add("job-1", Progress(2));
  log.Add("job-2", Progress(1));
  Save(log, /*ended=*/{"job-1"});
  // job-1's watchers: one saw both events and was ended, the other closed after one and was
  // dropped; job-2's goes on.
  EXPECT_EQ(ending->sequences, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ending->ended, 1);
  EXPECT_EQ(closing->sequences, (std::vector<int64_t>{1}));
  EXPECT_EQ(other->sequences, (std::vector<int64_t>{1}));
  EXPECT_EQ(other->ended, 0);
  EXPECT_EQ(log.watchers(), 1);

  // A watch of an ended job's history ends at once after its last page.
  auto late = std::make_shared<RecordingSink>();
  absl::StatusOr<WatchPosition> page = log.WatchPage("job-1", 0, 10, true, late);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(late->sequences, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(late->ended, 1);
  EXPECT_EQ(log.watchers(), 1);

  log.Unwatch("job-2", other.get());
  EXPECT_EQ(log.watchers(), 0);
}

TEST_F(JobEventLogTest, ProgressIsThinnedPastTheBoundAndNoticesStay) {
  constexpr int64_t kBound = 20;
  JobEventLog log(&clock_, store_.get(), kBound);
  log.AddJob("job-1", 0, 0);
  log.Add("job-1", Notice(1, "kept"));
  Save(log);
  for (int step = 1; step <= 200; ++step) {
    log.Add("job-1", Progress(step));
    Save(log);
  }
  absl::StatusOr<std::vector<v1::JobEvent>> stored = store_->LoadEvents("job-1");
  ASSERT_TRUE(stored.ok()) << stored.status();
  // Thinned, though not below the bound's worth of history, and never the notice.
  EXPECT_LT(static_cast<int64_t>(stored->size()), 201);
  EXPECT_LE(static_cast<int64_t>(stored->size()), 2 * kBound + 1);
  ASSERT_FALSE(stored->empty());
  EXPECT_EQ(stored->front().type(), v1::NOTICE);
  EXPECT_EQ(stored->front().message(), "kept");
  // The newest progress always stays.
  EXPECT_EQ(stored->back().progress().step(), 200);
}

}  // namespace
}  // namespace zeroshard::coordinator
