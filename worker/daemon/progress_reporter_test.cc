// ProgressReporter: every report sent once, in order, off the caller's thread; a failed send or
// the coordinator's "stop" reaches the next Post/Flush and ends sending.
#include "worker/daemon/progress_reporter.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace zeroshard::worker {
namespace {

v1::StepMetrics MetricsOfStep(int64_t step) {
  v1::StepMetrics metrics;
  metrics.set_step(step);
  return metrics;
}

// A coordinator stand-in: records the steps it was sent, answers `answer` for `stop_at` (and
// after), and can hold every send until released.
class RecordingSender {
 public:
  explicit RecordingSender(bool hold = false) : hold_(hold) {}

  absl::StatusOr<bool> Send(const v1::StepMetrics& metrics) {
    absl::MutexLock lock(&mu_);
    sent_.push_back(metrics.step());
    mu_.Await(absl::Condition(
        +[](bool* hold) { return !*hold; }, &hold_));
    if (metrics.step() == fail_at_) return absl::UnavailableError("coordinator down");
    return metrics.step() != stop_at_;
  }
  ProgressReporter::SendFn AsFn() {
    return [this](const v1::StepMetrics& metrics) { return Send(metrics); };
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  void WaitForSends(size_t count) {
    absl::MutexLock lock(&mu_);
    wanted_ = count;
    mu_.Await(absl::Condition(this, &RecordingSender::HasWanted));
  }
  std::vector<int64_t> sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }

  int64_t fail_at_ = -1;
  int64_t stop_at_ = -1;

 private:
  bool HasWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_.size() >= wanted_; }

  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_);
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> sent_ ABSL_GUARDED_BY(mu_);
};

TEST(ProgressReporterTest, PostReturnsWhileTheSendIsStillOut) {
  RecordingSender sender(/*hold=*/true);
  ProgressReporter reporter(sender.AsFn());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  sender.WaitForSends(1);  // step 1 is out and held
  // The training thread goes on posting while the coordinator has not answered.
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(2)));
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(3)));
  EXPECT_EQ(sender.sent(), std::vector<int64_t>({1}));
  sender.Release();
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.sent(), std::vector<int64_t>({1, 2, 3}));
}

TEST(ProgressReporterTest, NothingIsLostWhenThePostsOutrunTheSends) {
  RecordingSender sender;
  ProgressReporter reporter(sender.AsFn(), /*max_pending=*/1);
  std::vector<int64_t> expected;
  for (int64_t step = 1; step <= 200; ++step) {
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(step)));
    expected.push_back(step);
  }
  ASSERT_TRUE(*reporter.Flush());
  EXPECT_EQ(sender.sent(), expected);
}

TEST(ProgressReporterTest, AFailedSendReachesTheNextCallAndEndsSending) {
  RecordingSender sender;
  sender.fail_at_ = 2;
  ProgressReporter reporter(sender.AsFn());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  ASSERT_TRUE(reporter.Post(MetricsOfStep(2)).ok());
  const absl::StatusOr<bool> flushed = reporter.Flush();
  EXPECT_EQ(flushed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reporter.Post(MetricsOfStep(3)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reporter.Flush().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender.sent(), std::vector<int64_t>({1, 2}));
}

TEST(ProgressReporterTest, TheCoordinatorsStopReachesTheNextCallAndEndsSending) {
  RecordingSender sender;
  sender.stop_at_ = 2;
  ProgressReporter reporter(sender.AsFn());
  ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
  ASSERT_TRUE(reporter.Post(MetricsOfStep(2)).ok());
  EXPECT_FALSE(*reporter.Flush());
  EXPECT_FALSE(*reporter.Post(MetricsOfStep(3)));
  EXPECT_FALSE(*reporter.outcome());
  EXPECT_EQ(sender.sent(), std::vector<int64_t>({1, 2}));
}

TEST(ProgressReporterTest, DestroyingWithASendOutWaitsForItAndSendsNothingMore) {
  RecordingSender sender(/*hold=*/true);
  std::thread release;
  {
    ProgressReporter reporter(sender.AsFn());
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(1)));
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(2)));
    ASSERT_TRUE(*reporter.Post(MetricsOfStep(3)));
    sender.WaitForSends(1);
    release = std::thread([&sender] { sender.Release(); });
  }  // the destructor returns once the send that is out returns
  release.join();
  const std::vector<int64_t> sent = sender.sent();
  // Whether step 2 went out depends on who won the race with the destructor; step 3 never
  // does once step 2 was dropped or (if sent) the reporter was shutting down, and order holds.
  ASSERT_GE(sent.size(), 1u);
  ASSERT_LE(sent.size(), 3u);
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(sent[i], static_cast<int64_t>(i + 1));
  const std::vector<int64_t> later = sender.sent();
  EXPECT_EQ(later, sent);  // the sending thread is gone: nothing arrives after the destructor
}

}  // namespace
}  // namespace zeroshard::worker
