// Rank 0's per-step progress, sent to the coordinator from a thread of its own: the coordinator
// answers only after a durable (fsync'd) write, and the other ranks wait for rank 0 in the next
// step's collectives, so a report sent from the training thread delays every rank.
#ifndef ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_
#define ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "zeroshard/v1/types.pb.h"

namespace zeroshard::worker {

// Sends every posted report, in order, none lost: Post() returns at once unless
// `max_pending` reports are already waiting (then it waits for room, so a coordinator slower
// than the steps slows training down instead of growing memory without bound).
//
// The outcome of a send (an error, or the coordinator's "stop") is not seen by the Post() that
// queued it but by the next Post(), Flush() or outcome(): training learns of it one step late.
// After a failed send, or a "stop", nothing more is sent.
//
// Thread contract: Post, Flush and outcome may be called from any thread; the destructor stops
// the sending thread (reports not yet sent are dropped) and must not race other calls.
class ProgressReporter {
 public:
  // Sends one report; returns whether the run should go on (ReportProgressResponse's
  // continue_running). Called on the reporter's thread only, one call at a time.
  using SendFn = std::function<absl::StatusOr<bool>(const v1::StepMetrics&)>;

  explicit ProgressReporter(SendFn send, int64_t max_pending = 64);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Queues `metrics` and returns the outcome of the reports sent so far (see outcome()).
  absl::StatusOr<bool> Post(v1::StepMetrics metrics);
  // Waits until every queued report was sent (or sending stopped), then returns outcome().
  absl::StatusOr<bool> Flush();
  // The first failed send's error, false once the coordinator said stop, true otherwise.
  absl::StatusOr<bool> outcome() const;

 private:
  void SendLoop();
  bool StoppedLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutting_down_ || !failure_.ok() || !keep_going_;
  }

  const SendFn send_;
  const int64_t max_pending_;

  mutable absl::Mutex mu_;
  std::deque<v1::StepMetrics> pending_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // a report was taken off pending_ and is out
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool keep_going_ ABSL_GUARDED_BY(mu_) = true;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_
