// Retries of calls to the coordinator (see the header).
#include "worker/daemon/rpc_retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace zeroshard::worker {

bool IsRetryableRpcError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

RetryBackoff::RetryBackoff(RetryPolicy policy)
    : policy_(policy), next_(std::min(policy.initial_backoff, policy.max_backoff)) {}

absl::Duration RetryBackoff::Next() {
  const absl::Duration delay = next_;
  next_ = std::min(next_ * 2, policy_.max_backoff);
  return delay;
}

absl::Status RetryRpc(absl::string_view what, const std::function<absl::Status()>& attempt,
                      absl::Time deadline, const std::function<bool(absl::Duration)>& wait,
                      const RetryPolicy& policy) {
  RetryBackoff backoff(policy);
  int failures = 0;
  absl::Time first_failure;
  while (true) {
    const absl::Status status = attempt();
    if (status.ok() || !IsRetryableRpcError(status)) {
      if (failures > 0) {
        ZS_LOG(INFO) << what << ": answered after " << failures << " failed attempts ("
                     << absl::Now() - first_failure << ")";
      }
      return status;
    }
    if (failures++ == 0) {
      first_failure = absl::Now();
      ZS_LOG(WARNING) << what << ": the coordinator is unreachable (" << status
                      << "); retrying until it answers";
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::Status(
          status.code(),
          absl::StrCat(what, ": gave up after ", failures, " attempts in ",
                       absl::FormatDuration(absl::Now() - first_failure), ": ", status.message()));
    }
    if (!wait(std::min(backoff.Next(), left))) {
      return absl::CancelledError(
          absl::StrCat(what, ": stopped while retrying (", status.message(), ")"));
    }
  }
}

}  // namespace zeroshard::worker
