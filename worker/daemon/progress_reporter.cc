// Rank 0's per-step progress, sent from a thread of its own.
#include "worker/daemon/progress_reporter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace zeroshard::worker {

ProgressReporter::ProgressReporter(SendFn send, ProgressReporterOptions options)
    : send_(std::move(send)), options_(options), thread_([this] { SendLoop(); }) {}

ProgressReporter::~ProgressReporter() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  thread_.join();
}

absl::StatusOr<bool> ProgressReporter::Post(v1::StepMetrics metrics) {
  absl::MutexLock lock(&mu_);
  if (!StoppedLocked()) {
    if (static_cast<int64_t>(pending_.size()) >= std::max<int64_t>(options_.max_pending, 1)) {
      pending_.pop_front();
      ++dropped_;
      if (!drop_logged_) {
        drop_logged_ = true;
        ZS_LOG(WARNING) << "progress reports: " << pending_.size() + 1
                        << " wait for the coordinator; dropping the oldest from now on";
      }
    }
    pending_.push_back(std::move(metrics));
  }
  return OutcomeLocked();
}

absl::StatusOr<bool> ProgressReporter::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !sending_ && (pending_.empty() || StoppedLocked());
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("progress reports: ", pending_.size() + (sending_ ? 1 : 0),
                     " still unsent at the deadline (the coordinator stayed unreachable)"));
  }
  return OutcomeLocked();
}

void ProgressReporter::Cancel() {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = absl::CancelledError("progress reporting cancelled");
}

absl::StatusOr<bool> ProgressReporter::outcome() const {
  absl::MutexLock lock(&mu_);
  return OutcomeLocked();
}

int64_t ProgressReporter::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

absl::StatusOr<bool> ProgressReporter::OutcomeLocked() const {
  if (!failure_.ok()) return failure_;
  return keep_going_;
}

bool ProgressReporter::WaitToRetry(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return StoppedLocked(); };
  return !mu_.AwaitWithTimeout(absl::Condition(&stopped), delay);
}

void ProgressReporter::SendLoop() {
  while (true) {
    v1::StepMetrics metrics;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return StoppedLocked() || !pending_.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (StoppedLocked()) {
        pending_.clear();
        return;
      }
      metrics = std::move(pending_.front());
      pending_.pop_front();
      sending_ = true;
    }
    absl::StatusOr<bool> sent;
    const absl::Status status = RetryRpc(
        "ReportProgress",
        [&] {
          sent = send_(metrics);
          return sent.status();
        },
        absl::InfiniteFuture(), [this](absl::Duration delay) { return WaitToRetry(delay); },
        options_.retry);
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!status.ok()) {
      if (failure_.ok()) failure_ = status;
    } else if (!*sent) {
      keep_going_ = false;
    }
    if (status.ok() && drop_logged_) {
      drop_logged_ = false;
      ZS_LOG(INFO) << "progress reports: the coordinator answers again; " << dropped_
                   << " dropped so far";
    }
  }
}

}  // namespace zeroshard::worker
