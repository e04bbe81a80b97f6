// ProgressReporter: reports sent in order, off the caller's thread, while the coordinator keeps up;
// reports lagging more than max_lag, older than a PostLatest() or out when an outage began are
// superseded by the newest (their notices go with it), so the reports never fall far behind; the
// oldest waiting reports are dropped at the bound; other errors and the coordinator's "stop" reach
// the next Post/Flush and end sending; Cancel and Flush's deadline bound the waits.
#include "worker/daemon/progress_reporter.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace zeroshard::worker {
namespace {

v1::StepMetrics MetricsOfStep(int64_t step) {
  v1::StepMetrics metrics;
  metrics.set_step(step);
  return metrics;
}

// The reporters' clock: it only moves when a test advances it (max_lag).
common::FakeClock* TestClock() {
  static common::FakeClock* const clock = new common::FakeClock();
  return clock;
}

// Retries within milliseconds, so that outages in these tests cost no real time; the posts'
// times from TestClock().
ProgressReporterOptions FastRetries(int64_t max_pending = 10000) {
  ProgressReporterOptions options;
  options.clock = TestClock();
  options.max_pending = max_pending;
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_backoff = absl::Milliseconds(4);
  return options;
}

// A coordinator stand-in. Records every attempt and every delivered step; while `down` every
// attempt fails with UNAVAILABLE; `error_at` answers that step with `error`; `stop_at` answers it
// (and later ones) with "stop"; with `hold` every attempt waits until Release(). Thread-safe: the
// reporter's thread sends while the test's thread steers and reads.
class RecordingSender {
 public:
  explicit RecordingSender(bool hold = false) : hold_(hold) {}

  absl::StatusOr<bool> Send(const v1::StepMetrics& metrics, const std::string& notice) {
    absl::MutexLock lock(&mu_);
    ++attempts_;
    mu_.Await(absl::Condition(
        +[](bool* hold) { return !*hold; }, &hold_));
    if (down_) return absl::UnavailableError("coordinator down");
    if (metrics.step() == error_at_) return error_;
    delivered_.push_back(metrics.step());
    sends_.emplace_back(metrics.step(), notice);
    return stop_at_ < 0 || metrics.step() < stop_at_;
  }
  ProgressReporter::SendFn AsFn() {
    return [this](const v1::StepMetrics& metrics, const std::string& notice) {
      return Send(metrics, notice);
    };
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  void SetDown(bool down) {
    absl::MutexLock lock(&mu_);
    down_ = down;
  }
  void FailStepWith(int64_t step, absl::Status error) {
    absl::MutexLock lock(&mu_);
    error_at_ = step;
    error_ = std::move(error);
  }
  void StopAt(int64_t step) {
    absl::MutexLock lock(&mu_);
    stop_at_ = step;
  }
  // Waits until at least `count` attempts were made.
  void WaitForAttempts(int count) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return attempts_ >= count; };
    mu_.Await(absl::Condition(&reached));
  }
  std::vector<int64_t> delivered() {
    absl::MutexLock lock(&mu_);
    return delivered_;
  }
  // Every delivered (step, notice).
  std::vector<std::pair<int64_t, std::string>> sends() {
    absl::MutexLock lock(&mu_);
    return sends_;
  }
  int attempts() {
    absl::MutexLock lock(&mu_);
    return attempts_;
  }

 private:
  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_);
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t error_at_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t stop_at_ ABSL_GUARDED_BY(mu_) = -1;
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> delivered_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, std::string>> sends_ ABSL_GUARDED_BY(mu_);
};

std::vector<int64_t> Steps(int64_t first, int64_t last) {
  std::vector<int64_t> steps;
  for (int64_t step = first; step <= last; ++step) steps.push_back(step);
  return steps;
}

TEST(ProgressReporterTest, PostReturnsWhileTheSendIsStillOut) {
  RecordingSender sender(/*hold=*/true);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  sender.WaitForAttempts(1);  // step 1 is out and held
  // The training thread goes on posting while the coordinator has not answered.
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(2)));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(3)));
  EXPECT_TRUE(sender.delivered().empty());
  sender.Release();
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.delivered(), Steps(1, 3));
}

TEST(ProgressReporterTest, NothingIsLostWhileThePostsStayUnderTheBound) {
  RecordingSender sender;
  ProgressReporter reporter(sender.AsFn(), FastRetries(/*max_pending=*/200));
  for (int64_t step = 1; step <= 200; ++step) ASSERT_TRUE(*reporter.Post(MetricsOfStep(step)));
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.delivered(), Steps(1, 200));
  EXPECT_EQ(reporter.superseded(), 0);
}

TEST(ProgressReporterTest, EveryStepGoesInOrderWhileTheReportsLagLessThanMaxLag) {
  RecordingSender sender(/*hold=*/true);
  ProgressReporterOptions options = FastRetries();
  options.max_lag = absl::Seconds(1);
  ProgressReporter reporter(sender.AsFn(), options);
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  sender.WaitForAttempts(1);  // step 1 is out and held
  for (int64_t step = 2; step <= 50; ++step) {
    TestClock()->Advance(absl::Milliseconds(10));  // step 2 waits 480 ms in the end
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(step)));
  }
  sender.Release();
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.delivered(), Steps(1, 50));
  EXPECT_EQ(reporter.superseded(), 0);
}

TEST(ProgressReporterTest, ReportsLaggingMoreThanMaxLagAreSupersededByTheNewest) {
  RecordingSender sender(/*hold=*/true);
  ProgressReporterOptions options = FastRetries();
  options.max_lag = absl::Seconds(1);
  ProgressReporter reporter(sender.AsFn(), options);
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  sender.WaitForAttempts(1);  // step 1 is out and held: the coordinator is slow
  for (int64_t step = 2; step <= 10; ++step) ASSERT_TRUE(*reporter.Post(MetricsOfStep(step)));
  TestClock()->Advance(absl::Milliseconds(1001));
  // Step 2 has waited longer than max_lag: the newest report takes the place of all.
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(11)));
  EXPECT_EQ(reporter.superseded(), 9);
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(12)));  // waits behind 11, posted just now
  sender.Release();
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.delivered(), (std::vector<int64_t>{1, 11, 12}));
}

TEST(ProgressReporterTest, PostLatestGoesNextAndCarriesTheNoticesOfTheReportsItSupersedes) {
  RecordingSender sender(/*hold=*/true);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  sender.WaitForAttempts(1);
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(2), "deferred"));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(3)));
  ASSERT_TRUE(*reporter.PostLatest(MetricsOfStep(4), "taken"));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(5)));
  EXPECT_EQ(reporter.superseded(), 2);
  sender.Release();
  ASSERT_TRUE(*reporter.Flush());
  // One send per notice, in the order they were posted.
  const std::vector<std::pair<int64_t, std::string>> expected = {
      {1, ""}, {4, "deferred"}, {4, "taken"}, {5, ""}};
  EXPECT_EQ(sender.sends(), expected);
}

TEST(ProgressReporterTest, AnOutageIsRetriedThroughAndTheRetrySendsTheNewestReport) {
  RecordingSender sender;
  sender.SetDown(true);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1), "first"));
  sender.WaitForAttempts(3);  // step 1 failed and was retried twice
  // Training goes on while the coordinator is down: posts return at once, and OK.
  for (int64_t step = 2; step <= 50; ++step) ASSERT_TRUE(*reporter.Post(MetricsOfStep(step)));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(51), "last"));
  EXPECT_TRUE(*reporter.outcome());
  EXPECT_TRUE(sender.delivered().empty());
  sender.SetDown(false);
  ASSERT_TRUE(*reporter.Flush());
  // Not 50 stale reports one by one: the newest, with every notice.
  const std::vector<std::pair<int64_t, std::string>> expected = {{51, "first"}, {51, "last"}};
  EXPECT_EQ(sender.sends(), expected);
  EXPECT_EQ(reporter.superseded(), 50);
}

TEST(ProgressReporterTest, TheOldestWaitingReportsAreDroppedAtTheBound) {
  RecordingSender sender(/*hold=*/true);
  ProgressReporter reporter(sender.AsFn(), FastRetries(/*max_pending=*/10));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  sender.WaitForAttempts(1);  // step 1 is out and held
  for (int64_t step = 2; step <= 100; ++step) ASSERT_TRUE(*reporter.Post(MetricsOfStep(step)));
  EXPECT_EQ(reporter.superseded(), 89);  // 99 waited; the newest 10 are kept
  sender.Release();
  ASSERT_TRUE(*reporter.Flush());
  std::vector<int64_t> expected = {1};
  for (int64_t step : Steps(91, 100)) expected.push_back(step);
  EXPECT_EQ(sender.delivered(), expected);
}

TEST(ProgressReporterTest, DeadlineExceededIsRetriedToo) {
  RecordingSender sender;
  sender.FailStepWith(2, absl::DeadlineExceededError("no answer in time"));
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(2)));
  sender.WaitForAttempts(4);  // step 1, then step 2 three times
  // The next retry sends step 3 instead, which goes through.
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(3)));
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.delivered(), (std::vector<int64_t>{1, 3}));
}

class AnsweredErrorTest : public ::testing::TestWithParam<absl::StatusCode> {};

TEST_P(AnsweredErrorTest, ReachesTheNextCallAndEndsSendingWithoutRetries) {
  const absl::Status error(GetParam(), "the coordinator refused");
  RecordingSender sender;
  sender.FailStepWith(2, error);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  ASSERT_TRUE(reporter.Post(MetricsOfStep(2)).ok());
  EXPECT_EQ(reporter.Flush().status(), error);
  EXPECT_EQ(reporter.Post(MetricsOfStep(3)).status(), error);
  EXPECT_EQ(reporter.Flush().status(), error);
  EXPECT_EQ(sender.delivered(), Steps(1, 1));
  EXPECT_EQ(sender.attempts(), 2);
}

INSTANTIATE_TEST_SUITE_P(Codes, AnsweredErrorTest,
                         ::testing::Values(absl::StatusCode::kPermissionDenied,
                                           absl::StatusCode::kInvalidArgument,
                                           absl::StatusCode::kFailedPrecondition,
                                           absl::StatusCode::kNotFound));

TEST(ProgressReporterTest, TheCoordinatorsStopReachesTheNextCallAndEndsSending) {
  RecordingSender sender;
  sender.StopAt(2);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  ASSERT_TRUE(reporter.Post(MetricsOfStep(2)).ok());
  EXPECT_FALSE(*reporter.Flush());
  EXPECT_FALSE(*reporter.Post(MetricsOfStep(3)));
  EXPECT_FALSE(*reporter.outcome());
  EXPECT_EQ(sender.delivered(), Steps(1, 2));
}

TEST(ProgressReporterTest, CancelEndsTheRetriesAndWakesFlush) {
  RecordingSender sender;
  sender.SetDown(true);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(2)));
  sender.WaitForAttempts(1);
  absl::StatusOr<bool> flushed;
  std::thread flusher([&] { flushed = reporter.Flush(); });
  reporter.Cancel();
  flusher.join();
  EXPECT_EQ(flushed.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(reporter.Post(MetricsOfStep(3)).status().code(), absl::StatusCode::kCancelled);
  const int attempts = sender.attempts();
  sender.SetDown(false);
  EXPECT_EQ(reporter.Flush().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(sender.delivered().empty());
  EXPECT_EQ(sender.attempts(), attempts);  // Flush returned once retrying had stopped
}

TEST(ProgressReporterTest, FlushGivesUpAtItsDeadline) {
  RecordingSender sender;
  sender.SetDown(true);
  ProgressReporter reporter(sender.AsFn(), FastRetries());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  const absl::StatusOr<bool> flushed = reporter.Flush(absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(flushed.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(*reporter.outcome());  // the reporter itself goes on retrying
  sender.SetDown(false);
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.delivered(), Steps(1, 1));
}

TEST(ProgressReporterTest, DestroyingWithASendOutWaitsForItAndSendsNothingMore) {
  RecordingSender sender(/*hold=*/true);
  std::thread release;
  {
    ProgressReporter reporter(sender.AsFn(), FastRetries());
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(2)));
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(3)));
    sender.WaitForAttempts(1);
    release = std::thread([&sender] { sender.Release(); });
  }  // the destructor returns once the send that is out returns
  release.join();
  const std::vector<int64_t> sent = sender.delivered();
  // Whether step 2 went out depends on who won the race with the destructor; step 3 never
  // does once step 2 was dropped or (if sent) the reporter was shutting down, and order holds.
  ASSERT_GE(sent.size(), 1u);
  ASSERT_LE(sent.size(), 3u);
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(sent[i], static_cast<int64_t>(i + 1));
  EXPECT_EQ(sender.delivered(), sent);  // the sending thread is gone: nothing arrives after
}

}  // namespace
}  // namespace zeroshard::worker
