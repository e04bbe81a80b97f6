// Rank 0's per-step progress, sent to the coordinator from a thread of its own: the coordinator
// answers only after a durable (fsync'd) write, and the other ranks wait for rank 0 in the next
// step's collectives, so a report sent from the training thread delays every rank. Training
// never waits for the coordinator, which may be down (restarting) for a while.
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
#include "absl/time/time.h"
#include "worker/daemon/rpc_retry.h"
#include "zeroshard/v1/types.pb.h"

namespace zeroshard::worker {

struct ProgressReporterOptions {
  // Reports waiting to be sent (the one being sent aside). At the bound Post() drops the oldest
  // waiting one, so a long coordinator outage costs bounded memory and never blocks training.
  int64_t max_pending = 10000;
  // Sends that fail with UNAVAILABLE or DEADLINE_EXCEEDED are retried with this backoff.
  RetryPolicy retry;
};

// Sends the posted reports in order, each until the coordinator answers it: a send that fails
// with UNAVAILABLE or DEADLINE_EXCEEDED (the coordinator is down or restarting) is retried with
// backoff while later reports wait. Post() never blocks; when `max_pending` reports wait it drops
// the oldest waiting one and counts it (dropped()). Only intermediate reports pass through here:
// the final `finished` report is sent by the training thread after Flush(), so it is never
// dropped.
//
// The outcome of a send (another error, or the coordinator's "stop") is not seen by the Post()
// that queued it but by the next Post(), Flush() or outcome(): training learns of it one step
// late. After such an error, a "stop", or Cancel(), nothing more is sent.
//
// Thread contract: Post, Flush, Cancel, outcome and dropped may be called from any thread; the
// destructor stops the sending thread (waiting for a send that is out; reports not yet sent are
// dropped) and must not race other calls.
class ProgressReporter {
 public:
  // Sends one report; returns whether the run should go on (ReportProgressResponse's
  // continue_running). Called on the reporter's thread only, one call at a time. Resent reports
  // must be harmless: the coordinator records a step once.
  using SendFn = std::function<absl::StatusOr<bool>(const v1::StepMetrics&)>;

  explicit ProgressReporter(SendFn send, ProgressReporterOptions options = {});
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Queues `metrics` and returns the outcome of the reports sent so far (see outcome()).
  absl::StatusOr<bool> Post(v1::StepMetrics metrics);
  // Waits until every queued report was sent (or sending stopped), then returns outcome();
  // DEADLINE_EXCEEDED when reports are still unsent at `deadline` (the coordinator stayed away).
  absl::StatusOr<bool> Flush(absl::Time deadline = absl::InfiniteFuture());
  // Stops sending and retrying at once (the run is aborted): the waiting reports are dropped and
  // outcome() is CANCELLED from now on. A send that is out still completes.
  void Cancel();
  // The first failed send's error, false once the coordinator said stop, true otherwise.
  absl::StatusOr<bool> outcome() const;
  // Reports dropped at the bound so far.
  int64_t dropped() const;

 private:
  void SendLoop();
  absl::StatusOr<bool> OutcomeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool StoppedLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutting_down_ || !failure_.ok() || !keep_going_;
  }
  // Waits `delay` between retries; false when sending stopped meanwhile.
  bool WaitToRetry(absl::Duration delay);

  const SendFn send_;
  const ProgressReporterOptions options_;

  mutable absl::Mutex mu_;
  std::deque<v1::StepMetrics> pending_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // a report was taken off pending_ and is out
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool keep_going_ ABSL_GUARDED_BY(mu_) = true;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether a drop was logged since the last report that went through (one line per outage).
  bool drop_logged_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_
