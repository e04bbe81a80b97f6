// RetryRpc and its backoff: which errors are retried, the waits between attempts, and the ways a
// retry loop ends (an answer, a deadline, the caller stopping). Waits are recorded, not slept.
#include "worker/daemon/rpc_retry.h"

#include <deque>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zeroshard::worker {
namespace {

// A coordinator stand-in answering each attempt with the next of `answers` (then OK). Not
// thread-safe: the retry loop calls it on the test's thread.
class ScriptedCall {
 public:
  explicit ScriptedCall(std::deque<absl::Status> answers) : answers_(std::move(answers)) {}
  absl::Status operator()() {
    ++attempts;
    if (answers_.empty()) return absl::OkStatus();
    absl::Status answer = answers_.front();
    answers_.pop_front();
    return answer;
  }
  int attempts = 0;

 private:
  std::deque<absl::Status> answers_;
};

TEST(RpcRetryTest, OnlyUnavailableAndDeadlineExceededAreRetryable) {
  EXPECT_TRUE(IsRetryableRpcError(absl::UnavailableError("down")));
  EXPECT_TRUE(IsRetryableRpcError(absl::DeadlineExceededError("slow")));
  for (const absl::Status& answer :
       {absl::OkStatus(), absl::PermissionDeniedError("p"), absl::InvalidArgumentError("i"),
        absl::FailedPreconditionError("f"), absl::NotFoundError("n"), absl::InternalError("x"),
        absl::CancelledError("c")}) {
    EXPECT_FALSE(IsRetryableRpcError(answer)) << answer;
  }
}

TEST(RpcRetryTest, BackoffDoublesUpToItsCap) {
  RetryBackoff backoff(RetryPolicy{});
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 8; ++i) delays.push_back(backoff.Next());
  const std::vector<absl::Duration> expected = {absl::Milliseconds(100),  absl::Milliseconds(200),
                                                absl::Milliseconds(400),  absl::Milliseconds(800),
                                                absl::Milliseconds(1600), absl::Seconds(2),
                                                absl::Seconds(2),         absl::Seconds(2)};
  EXPECT_EQ(delays, expected);
}

TEST(RpcRetryTest, RetriesThroughAnOutageUntilTheAnswer) {
  ScriptedCall call({absl::UnavailableError("connection refused"),
                     absl::DeadlineExceededError("no answer"), absl::UnavailableError("again")});
  std::vector<absl::Duration> waits;
  const absl::Status status = RetryRpc(
      "Test", [&] { return call(); }, absl::InfiniteFuture(),
      [&](absl::Duration delay) {
        waits.push_back(delay);
        return true;
      });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(call.attempts, 4);
  EXPECT_EQ(waits, (std::vector<absl::Duration>{absl::Milliseconds(100), absl::Milliseconds(200),
                                                absl::Milliseconds(400)}));
}

TEST(RpcRetryTest, AnAnswerThatIsAnErrorEndsAtOnce) {
  for (const absl::Status& answer :
       {absl::PermissionDeniedError("not your rank"), absl::InvalidArgumentError("bad"),
        absl::FailedPreconditionError("stale"), absl::NotFoundError("no job")}) {
    ScriptedCall call({absl::UnavailableError("down"), answer});
    int waits = 0;
    const absl::Status status = RetryRpc(
        "Test", [&] { return call(); }, absl::InfiniteFuture(),
        [&](absl::Duration) {
          ++waits;
          return true;
        });
    EXPECT_EQ(status, answer);
    EXPECT_EQ(call.attempts, 2);
    EXPECT_EQ(waits, 1);
  }
}

TEST(RpcRetryTest, ThePassedDeadlineEndsItWithTheLastError) {
  ScriptedCall call({absl::UnavailableError("down"), absl::UnavailableError("still down")});
  const absl::Status status = RetryRpc(
      "ReportProgress", [&] { return call(); }, absl::Now(), [](absl::Duration) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(status.message(), "ReportProgress: gave up after 1 attempts"))
      << status;
  EXPECT_EQ(call.attempts, 1);
}

TEST(RpcRetryTest, WaitsAreCutToTheDeadline) {
  ScriptedCall call({absl::UnavailableError("down")});
  std::vector<absl::Duration> waits;
  RetryPolicy slow;
  slow.initial_backoff = absl::Hours(1);
  slow.max_backoff = absl::Hours(1);
  const absl::Status status = RetryRpc(
      "Test", [&] { return call(); }, absl::Now() + absl::Minutes(5),
      [&](absl::Duration delay) {
        waits.push_back(delay);
        return true;
      },
      slow);
  EXPECT_TRUE(status.ok()) << status;
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_LE(waits[0], absl::Minutes(5));
  EXPECT_GT(waits[0], absl::Minutes(4));
}

TEST(RpcRetryTest, AStoppingCallerEndsItCancelled) {
  ScriptedCall call({absl::UnavailableError("down"), absl::UnavailableError("down")});
  const absl::Status status = RetryRpc(
      "Test", [&] { return call(); }, absl::InfiniteFuture(), [](absl::Duration) { return false; });
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(absl::StrContains(status.message(), "down")) << status;
  EXPECT_EQ(call.attempts, 1);
}

}  // namespace
}  // namespace zeroshard::worker
