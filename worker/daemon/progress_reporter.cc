// Rank 0's per-step progress, sent from a thread of its own.
#include "worker/daemon/progress_reporter.h"

#include <utility>

namespace zeroshard::worker {

ProgressReporter::ProgressReporter(SendFn send, int64_t max_pending)
    : send_(std::move(send)),
      max_pending_(max_pending < 1 ? 1 : max_pending),
      thread_([this] { SendLoop(); }) {}

ProgressReporter::~ProgressReporter() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  thread_.join();
}

absl::StatusOr<bool> ProgressReporter::Post(v1::StepMetrics metrics) {
  absl::MutexLock lock(&mu_);
  auto has_room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return StoppedLocked() || static_cast<int64_t>(pending_.size()) < max_pending_;
  };
  mu_.Await(absl::Condition(&has_room));
  if (!StoppedLocked()) pending_.push_back(std::move(metrics));
  if (!failure_.ok()) return failure_;
  return keep_going_;
}

absl::StatusOr<bool> ProgressReporter::Flush() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !sending_ && (pending_.empty() || StoppedLocked());
  };
  mu_.Await(absl::Condition(&drained));
  if (!failure_.ok()) return failure_;
  return keep_going_;
}

absl::StatusOr<bool> ProgressReporter::outcome() const {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return failure_;
  return keep_going_;
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
    const absl::StatusOr<bool> sent = send_(metrics);
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!sent.ok()) {
      failure_ = sent.status();
    } else if (!*sent) {
      keep_going_ = false;
    }
  }
}

}  // namespace zeroshard::worker
