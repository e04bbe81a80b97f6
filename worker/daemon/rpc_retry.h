// Retrying a worker's calls to the coordinator through an outage (a restart, a network blip):
// which errors are worth repeating and the backoff, shared by every report and commit.
#ifndef ZEROSHARD_WORKER_DAEMON_RPC_RETRY_H_
#define ZEROSHARD_WORKER_DAEMON_RPC_RETRY_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zeroshard::worker {

struct RetryPolicy {
  // The wait after the first failed attempt; it doubles after each further one, up to
  // max_backoff.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
};

// Whether a failed call may succeed if made again: it reached no serving coordinator
// (UNAVAILABLE) or had no answer in time (DEADLINE_EXCEEDED; the call may have been carried out,
// so retried calls must be idempotent). Every other error is the coordinator's answer.
bool IsRetryableRpcError(const absl::Status& status);

// The waits between the attempts of one call: initial_backoff, doubling, capped at max_backoff.
// Not thread-safe: one per retry loop.
class RetryBackoff {
 public:
  explicit RetryBackoff(RetryPolicy policy);
  // The wait before the next attempt.
  absl::Duration Next();

 private:
  const RetryPolicy policy_;
  absl::Duration next_;
};

// Calls `attempt` until it returns OK or an error that is not retryable, and returns that.
// Between attempts it calls `wait(delay)` (the backoff, cut to what is left before `deadline`),
// which returns false when the caller is stopping (an abort, a shutdown): then the result is
// CANCELLED. When `deadline` passes the last error is returned, its message saying so. `what`
// names the call in the log: one warning when it first fails, one line when it goes through
// after failing. Runs on the caller's thread, as do `attempt` and `wait`.
absl::Status RetryRpc(absl::string_view what, const std::function<absl::Status()>& attempt,
                      absl::Time deadline, const std::function<bool(absl::Duration)>& wait,
                      const RetryPolicy& policy = RetryPolicy());

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_RPC_RETRY_H_
