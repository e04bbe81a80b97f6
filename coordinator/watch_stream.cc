// A WatchJob stream: history a page at a time, then the job's live events.
#include "coordinator/watch_stream.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "coordinator/request_parsing.h"

namespace zeroshard::coordinator {

void WatchSink::Start(int64_t after_sequence) {
  {
    absl::MutexLock lock(&mu_);
    last_queued_sequence_ = after_sequence;
  }
  ReadHistory();
}

void WatchSink::ReadHistory() {
  // The manager holds the sink only once it follows; until then this call keeps it alive.
  const std::shared_ptr<WatchSink> self = shared_from_this();
  while (true) {
    int64_t after_sequence;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || following_ || reading_page_ || writing_) return;
      reading_page_ = true;
      after_sequence = last_queued_sequence_;
    }
    // The page's events arrive through OnEvent (and start writing) before this returns.
    absl::StatusOr<JobManager::WatchPosition> position =
        manager_->WatchPage(job_id_, after_sequence, static_cast<int64_t>(page_events_), self);
    absl::MutexLock lock(&mu_);
    reading_page_ = false;
    if (!position.ok()) {
      if (!finished_) FinishLocked(common::ToGrpcStatus(position.status()));
      return;
    }
    following_ = position->following;
  }
}

bool WatchSink::OnEvent(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  if (finished_) return false;
  if (queue_.size() >= max_backlog_) {
    FinishLocked(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("watch: the watcher fell behind by ", queue_.size(),
                     " events; reconnect with after_sequence=", last_written_sequence_)));
    return false;
  }
  QueuedEvent queued{event.sequence(), grpc::ByteBuffer()};
  if (absl::Status serialized = SerializeResponse(event, &queued.bytes); !serialized.ok()) {
    FinishLocked(common::ToGrpcStatus(serialized));
    return false;
  }
  queue_.push_back(std::move(queued));
  last_queued_sequence_ = event.sequence();
  if (!writing_) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front().bytes);
  }
  return true;
}

void WatchSink::OnJobEnded() {
  absl::MutexLock lock(&mu_);
  job_ended_ = true;
  if (!writing_ && !finished_) FinishLocked(grpc::Status::OK);
}

void WatchSink::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch: write failed"));
      return;
    }
    last_written_sequence_ = queue_.front().sequence;
    queue_.pop_front();
    if (!queue_.empty()) {
      reactor_->StartWrite(&queue_.front().bytes);
      return;
    }
    writing_ = false;
    if (job_ended_) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    if (following_) return;
  }
  ReadHistory();
}

void WatchSink::OnCancel() {
  absl::MutexLock lock(&mu_);
  if (!finished_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch: cancelled"));
}

void WatchSink::Revoke() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  FinishLocked(grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      absl::StrCat("watch: token revoked: the token (or client certificate) this stream was opened "
                   "with left the coordinator's token file, or now names another identity or "
                   "role, at its reload (SIGHUP); watch again with a current token and "
                   "after_sequence=",
                   last_written_sequence_)));
}

void WatchSink::Detach() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  reactor_ = nullptr;
  queue_.clear();
}

void WatchSink::FinishLocked(const grpc::Status& status) {
  finished_ = true;
  if (reactor_ != nullptr) reactor_->Finish(status);
}

}  // namespace zeroshard::coordinator
