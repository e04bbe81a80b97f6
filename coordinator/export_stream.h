// One ExportCheckpoint stream: a committed checkpoint read on a thread of its own and written to
// the client as consolidated fp32 weights, a chunk at a time at the client's pace.
#ifndef ZEROSHARD_COORDINATOR_EXPORT_STREAM_H_
#define ZEROSHARD_COORDINATOR_EXPORT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/export.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// Bytes per ExportCheckpointChunk (the last one may be shorter).
constexpr size_t kExportChunkBytes = checkpoint::kDefaultExportChunkBytes;
// Chunks queued at most, the one being written included: the next chunk is ready when a write
// completes, and a client that does not read holds no more than this.
constexpr size_t kMaxQueuedExportChunks = 2;

// One ExportCheckpoint stream. A thread of its own finds the checkpoint, reads it and cuts the
// exported file into chunks; the reactor writes one chunk at a time. The thread waits while the
// queue is full, so the client's pace sets the reading's; once the client goes away (or a write
// fails) its next chunk ends the reading. The call finishes only after the thread has ended and no
// write is in flight, so OnDone's join does not wait.
// Thread contract: the reading thread and gRPC's reactions meet under mu_. StartWrite and Finish
// are called with mu_ held: gRPC never runs a reaction inline with the call that starts the
// operation, so this cannot re-enter.
// Writes serialized ExportCheckpointChunks: the method is registered raw.
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `reading_ended` runs on the thread once it stops reading (before the call finishes);
  // `waits_for_testing` as ServiceOptions::export_waits_for_testing.
  ExportReactor(JobManager* manager, CoordinatorMetrics* metrics,
                std::function<void()> reading_ended, std::function<void(int64_t)> waits_for_testing)
      : manager_(manager),
        metrics_(metrics),
        reading_ended_(std::move(reading_ended)),
        waits_for_testing_(std::move(waits_for_testing)),
        start_(absl::Now()) {}

  void Start(std::string job_id, std::optional<int64_t> step);

  // Ends a call that reads nothing (a refused request).
  void Refuse(const absl::Status& status);

  void OnWriteDone(bool ok) override;

  void OnCancel() override;

  void OnDone() override;

  // The credential the stream was opened with was revoked: it stops reading and ends
  // UNAUTHENTICATED (once the write in flight, if any, is done; not after it ended).
  void Revoke();

  // How a token reload reaches this reactor while it lives (OnDone detaches it first).
  struct Handle {
    absl::Mutex mu;
    ExportReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<Handle> handle() const { return handle_; }
  // Runs in OnDone, before the reactor is deleted. Set before Start().
  void set_done(std::function<void()> done) { done_ = std::move(done); }

 private:
  // The thread's work: everything but the writes.
  absl::Status Read(const std::string& job_id, std::optional<int64_t> step);

  // Queues a chunk once there is room. CANCELLED when the client is gone.
  absl::Status Push(const v1::ExportCheckpointChunk& chunk);

  bool RoomOrGoneLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return gone_ || queue_.size() < kMaxQueuedExportChunks;
  }

  void FinishIfDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobManager* const manager_;
  CoordinatorMetrics* const metrics_;
  const std::function<void()> reading_ended_;
  const std::function<void(int64_t)> waits_for_testing_;
  const absl::Time start_;
  // Assigned by Start() under mu_, joined by OnDone().
  std::thread thread_;

  mutable absl::Mutex mu_;
  // Chunks not yet written; the front one is being written while `writing_`. A deque keeps it in
  // place while more are queued behind it.
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t bytes_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // The client went away or a write failed: nothing more is written.
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  // The thread has ended (or never started) with `read_status_`.
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status read_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Its credential was revoked (Revoke): it ends UNAUTHENTICATED.
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  const std::shared_ptr<Handle> handle_ = [this] {
    auto handle = std::make_shared<Handle>();
    absl::MutexLock lock(&handle->mu);
    handle->reactor = this;
    return handle;
  }();
  std::function<void()> done_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_EXPORT_STREAM_H_
