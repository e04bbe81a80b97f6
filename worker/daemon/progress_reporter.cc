// Rank 0's per-step progress, sent from a thread of its own.
#include "worker/daemon/progress_reporter.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace zeroshard::worker {
namespace {

// Appends `from`'s notices to `to`'s, in order.
void MoveNotices(std::vector<std::string>& from, std::vector<std::string>& to) {
  to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  from.clear();
}

}  // namespace

ProgressReporter::ProgressReporter(SendFn send, ProgressReporterOptions options)
    : send_(std::move(send)), options_(options), thread_([this] { SendLoop(); }) {}

ProgressReporter::~ProgressReporter() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  thread_.join();
}

absl::StatusOr<bool> ProgressReporter::Post(v1::StepMetrics metrics, std::string notice) {
  return Enqueue(std::move(metrics), std::move(notice), /*latest=*/false);
}

absl::StatusOr<bool> ProgressReporter::PostLatest(v1::StepMetrics metrics, std::string notice) {
  return Enqueue(std::move(metrics), std::move(notice), /*latest=*/true);
}

absl::StatusOr<bool> ProgressReporter::Enqueue(v1::StepMetrics metrics, std::string notice,
                                               bool latest) {
  absl::MutexLock lock(&mu_);
  if (StoppedLocked()) return OutcomeLocked();
  Report report;
  report.metrics = std::move(metrics);
  if (!notice.empty()) report.notices.push_back(std::move(notice));
  report.posted = options_.clock->Now();
  const bool lagging =
      !pending_.empty() && report.posted - pending_.front().posted > options_.max_lag;
  pending_.push_back(std::move(report));
  if (lagging && !lag_logged_) {
    lag_logged_ = true;
    ZS_LOG(INFO) << "progress reports: the coordinator records them slower than training runs ("
                 << pending_.size() << " waiting, the oldest posted over "
                 << absl::FormatDuration(options_.max_lag)
                 << " ago); sending the newest only while it lags (logged once per run)";
  }
  if (latest || lagging) {
    SupersedeWaitingLocked();
  } else if (static_cast<int64_t>(pending_.size()) > std::max<int64_t>(options_.max_pending, 1)) {
    MoveNotices(pending_.front().notices, pending_[1].notices);
    pending_.pop_front();
    ++superseded_;
  }
  return OutcomeLocked();
}

void ProgressReporter::SupersedeWaitingLocked() {
  if (pending_.size() < 2) return;
  Report newest = std::move(pending_.back());
  pending_.pop_back();
  std::vector<std::string> notices;
  for (Report& report : pending_) MoveNotices(report.notices, notices);
  MoveNotices(newest.notices, notices);
  newest.notices = std::move(notices);
  superseded_ += static_cast<int64_t>(pending_.size());
  pending_.clear();
  pending_.push_back(std::move(newest));
}

void ProgressReporter::TakeNewerLocked(Report& out) {
  if (pending_.empty()) return;
  SupersedeWaitingLocked();
  Report& newest = pending_.front();
  MoveNotices(newest.notices, out.notices);
  out.metrics = std::move(newest.metrics);
  out.posted = newest.posted;
  pending_.clear();
  ++superseded_;  // the stale one that was out
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

int64_t ProgressReporter::superseded() const {
  absl::MutexLock lock(&mu_);
  return superseded_;
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
    Report out;
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
      out = std::move(pending_.front());
      pending_.pop_front();
      sending_ = true;
    }
    // The report, once per notice (at least once); a retry sends the newest report by then, with
    // the notices not sent yet.
    absl::Status status;
    bool keep_going = true;
    size_t next_notice = 0;
    do {
      absl::StatusOr<bool> sent;
      bool first_attempt = true;
      status = RetryRpc(
          "ReportProgress",
          [&] {
            if (!first_attempt) {
              absl::MutexLock lock(&mu_);
              out.notices.erase(out.notices.begin(), out.notices.begin() + next_notice);
              next_notice = 0;
              TakeNewerLocked(out);
            }
            first_attempt = false;
            sent = send_(out.metrics,
                         next_notice < out.notices.size() ? out.notices[next_notice] : "");
            return sent.status();
          },
          absl::InfiniteFuture(), [this](absl::Duration delay) { return WaitToRetry(delay); },
          options_.retry);
      keep_going = status.ok() && *sent;
      ++next_notice;
    } while (keep_going && next_notice < out.notices.size());
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!status.ok()) {
      if (failure_.ok()) failure_ = status;
    } else if (!keep_going) {
      keep_going_ = false;
    }
  }
}

}  // namespace zeroshard::worker
