// One WatchJob stream: the sink the job manager sends a job's events to, and the reactor that
// writes them to the client.
#ifndef ZEROSHARD_COORDINATOR_WATCH_STREAM_H_
#define ZEROSHARD_COORDINATOR_WATCH_STREAM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_manager.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

class WatchReactor;

// The manager's handle on one WatchJob stream. First it reads the history from the manager a
// page at a time, the next page once the last one is written, so a history of any length costs
// one page of memory; the last page makes it follow the job (JobManager::WatchPage). Never
// blocks: events queue here and the reactor writes them one at a time; a full queue ends the
// stream (the watcher fell behind live events).
// Thread-safe. StartWrite and Finish are called with mu_ held: gRPC never runs a reaction inline
// with the call that starts the operation, so this cannot re-enter. mu_ is never held while
// calling the manager, which calls OnEvent and OnJobEnded with its own lock held.
class WatchSink final : public JobEventSink, public std::enable_shared_from_this<WatchSink> {
 public:
  WatchSink(WatchReactor* reactor, JobManager* manager, std::string job_id, size_t max_backlog,
            size_t page_events)
      : reactor_(reactor),
        manager_(manager),
        job_id_(std::move(job_id)),
        max_backlog_(max_backlog),
        page_events_(std::max<size_t>(1, std::min(page_events, max_backlog))) {}

  // Sends the history after `after_sequence`, then follows the job.
  void Start(int64_t after_sequence);
  bool OnEvent(const v1::JobEvent& event) override;
  void OnJobEnded() override;
  // The reactor finished writing the front event.
  void OnWriteDone(bool ok);
  // The client went away.
  void OnCancel();
  // The credential the stream was opened with was revoked: ends it UNAUTHENTICATED (once; not
  // after it ended).
  void Revoke();
  // The reactor is about to be deleted.
  void Detach();

 private:
  // Reads history pages while the queue is empty, until the sink follows the job, its stream
  // has finished, or another call is reading one.
  void ReadHistory() ABSL_LOCKS_EXCLUDED(mu_);
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Null once the reactor is done.
  WatchReactor* reactor_ ABSL_GUARDED_BY(mu_);
  JobManager* const manager_;
  const std::string job_id_;
  const size_t max_backlog_;
  const size_t page_events_;
  // The sequence of the last event queued: the next page starts after it.
  int64_t last_queued_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // A page is being read (on one thread at a time: two would send events twice).
  bool reading_page_ ABSL_GUARDED_BY(mu_) = false;
  // The manager sends every new event; no more pages are read.
  bool following_ ABSL_GUARDED_BY(mu_) = false;
  // Events not yet written, serialized; the front one is being written while `writing_`.
  struct QueuedEvent {
    int64_t sequence;
    grpc::ByteBuffer bytes;
  };
  std::deque<QueuedEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool job_ended_ ABSL_GUARDED_BY(mu_) = false;
  // Finish was called: nothing more is written.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_written_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

// Writes serialized JobEvents: the method is registered raw (see CoordinatorServiceBase).
// Thread contract: gRPC calls its reactions; everything they do goes through the sink (see
// WatchSink), and OnDone deletes it.
class WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(JobManager* manager, std::string job_id, size_t max_backlog, size_t page_events)
      : manager_(manager),
        job_id_(job_id),
        sink_(std::make_shared<WatchSink>(this, manager, std::move(job_id), max_backlog,
                                          page_events)) {}

  std::shared_ptr<WatchSink> sink() { return sink_; }
  // `released` runs once the stream is done; set before the stream starts.
  void set_released(std::function<void()> released) { released_ = std::move(released); }
  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }
  void OnDone() override {
    sink_->Detach();
    // A cancelled watch of a quiet job would otherwise stay in the manager until its next event.
    manager_->Unwatch(job_id_, sink_.get());
    if (released_) released_();
    delete this;
  }

 private:
  JobManager* const manager_;
  const std::string job_id_;
  std::shared_ptr<WatchSink> sink_;
  std::function<void()> released_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_WATCH_STREAM_H_
