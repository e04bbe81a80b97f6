// Rank 0's per-step progress, sent to the coordinator from a thread of its own: the coordinator
// answers only after a durable (fsync'd) write, and the other ranks wait for rank 0 in the next
// step's collectives, so a report sent from the training thread delays every rank. Training
// never waits for the coordinator, which may be down (restarting) for a while, and the reports
// never fall far behind training: a fast job posts reports faster than the coordinator records
// them, and reports sent one by one in order would lag further and further (seconds), long after
// the checkpoints they lead up to were committed.
#ifndef ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_
#define ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/daemon/rpc_retry.h"
#include "zeroshard/v1/types.pb.h"

namespace zeroshard::worker {

struct ProgressReporterOptions {
  // How far the reports may fall behind: when the oldest waiting report was posted longer ago
  // than this, Post() replaces every waiting report with the new one (the steps in between are
  // not reported). While the coordinator keeps up (and through short stalls) every step is
  // reported, in order.
  absl::Duration max_lag = absl::Seconds(1);
  // Reports waiting to be sent (the one being sent aside), a bound on memory whatever the clock
  // does: at the bound Post() drops the oldest waiting one.
  int64_t max_pending = 10000;
  // Sends that fail with UNAVAILABLE or DEADLINE_EXCEEDED are retried with this backoff; each
  // retry sends the newest report by then (a report that waited through an outage is stale).
  RetryPolicy retry;
  // Times the posts (max_lag). Not owned; must outlive the reporter.
  common::Clock* clock = common::Clock::Real();
};

// Sends the posted reports in order, at most one at a time, each until the coordinator answers
// it: a send that fails with UNAVAILABLE or DEADLINE_EXCEEDED (the coordinator is down or
// restarting) is retried with backoff. Reports that can no longer be sent in time are
// superseded: by max_lag, by PostLatest(), by max_pending, and on a retry (which sends the newest
// report). A superseded report's notice is not lost: it goes with the report that superseded
// it. Post() never blocks. superseded() counts the reports never sent. Only intermediate reports
// pass through here: the final `finished` report is sent by the training thread after Flush().
//
// The outcome of a send (another error, or the coordinator's "stop") is not seen by the Post()
// that queued it but by the next Post(), Flush() or outcome(): training learns of it one step
// late. After such an error, a "stop", or Cancel(), nothing more is sent.
//
// Thread contract: Post, PostLatest, Flush, Cancel, outcome and superseded may be called from any
// thread; the destructor stops the sending thread (waiting for a send that is out; reports not yet
// sent are dropped) and must not race other calls.
class ProgressReporter {
 public:
  // Sends one report with `notice` (empty: none; it becomes a NOTICE event of the job); returns
  // whether the run should go on (ReportProgressResponse's continue_running). Called on the
  // reporter's thread only, one call at a time. Resent reports must be harmless: the
  // coordinator records a step once (a report may go again with another notice).
  using SendFn =
      std::function<absl::StatusOr<bool>(const v1::StepMetrics&, const std::string& notice)>;

  explicit ProgressReporter(SendFn send, ProgressReporterOptions options = {});
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Queues `metrics` (with `notice`, if not empty) and returns the outcome of the reports sent so
  // far (see outcome()).
  absl::StatusOr<bool> Post(v1::StepMetrics metrics, std::string notice = "");
  // As Post(), and every waiting report is superseded by this one: it goes next (after the send
  // that is out). The run posts so at each checkpoint, so that the coordinator hears of a step
  // at least that far before the checkpoint is committed.
  absl::StatusOr<bool> PostLatest(v1::StepMetrics metrics, std::string notice = "");
  // Waits until every queued report was sent (or sending stopped), then returns outcome();
  // DEADLINE_EXCEEDED when reports are still unsent at `deadline` (the coordinator stayed away).
  absl::StatusOr<bool> Flush(absl::Time deadline = absl::InfiniteFuture());
  // Stops sending and retrying at once (the run is aborted): the waiting reports are dropped and
  // outcome() is CANCELLED from now on. A send that is out still completes.
  void Cancel();
  // The first failed send's error, false once the coordinator said stop, true otherwise.
  absl::StatusOr<bool> outcome() const;
  // Reports superseded (or dropped at max_pending) so far: never sent.
  int64_t superseded() const;

 private:
  struct Report {
    v1::StepMetrics metrics;
    std::vector<std::string> notices;  // each goes in a send of its own
    absl::Time posted;
  };

  absl::StatusOr<bool> Enqueue(v1::StepMetrics metrics, std::string notice, bool latest);
  // Replaces the waiting reports with the newest one, keeping their notices.
  void SupersedeWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a retry: the report that is out becomes the newest waiting one, if there is one.
  void TakeNewerLocked(Report& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  std::deque<Report> pending_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // a report was taken off pending_ and is out
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool keep_going_ ABSL_GUARDED_BY(mu_) = true;
  int64_t superseded_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether a lag was logged (once per reporter).
  bool lag_logged_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_PROGRESS_REPORTER_H_
