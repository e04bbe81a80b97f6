// Every job's event history as the job manager keeps it: sequence numbers, events durable before
// any watcher sees them, PROGRESS thinning past a bound, and the watchers (sinks) that page
// through the stored history and then follow the job.
#ifndef ZEROSHARD_COORDINATOR_JOB_EVENT_LOG_H_
#define ZEROSHARD_COORDINATOR_JOB_EVENT_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/job_store.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// Receives one job's events. Called with the manager's lock held: it must not block and must
// not call back into the manager.
class JobEventSink {
 public:
  virtual ~JobEventSink() = default;
  // Returns false when the sink is closed (its watcher went away or fell behind); the manager
  // then drops it.
  virtual bool OnEvent(const v1::JobEvent& event) = 0;
  // The job reached a final state: no more events will come.
  virtual void OnJobEnded() = 0;
};

// A NOTICE event of `generation` saying `message`: the one way the coordinator builds them (the
// log fills in the job id, sequence and time when it is added).
v1::JobEvent Notice(int64_t generation, std::string message);

// Where a watch stands after one page (JobEventLog::WatchPage).
struct WatchPosition {
  // The sequence of the last event sent (after_sequence when none was).
  int64_t last_sequence = 0;
  // The sink follows the job now; no more pages are needed.
  bool following = false;
};

// The event side of every job. An event is added (Add) with the next sequence of its job, waits
// in unpersisted() until the caller has saved it in the JobStore together with the jobs it
// changed, and only then (Persisted) reaches the job's sinks: no watcher sees an event a
// coordinator restart could lose, or whose sequence the next coordinator would give to another.
// After each save a job whose stored events exceed max_events_per_job is thinned
// (JobStore::ThinProgressEvents; see JobManagerOptions::max_events_per_job).
// Thread contract: not thread-safe. The JobManager owns it under its lock (a member guarded by
// the manager's mutex) and calls it only with that lock held; it calls sinks from inside, so
// sinks obey JobEventSink's rules.
class JobEventLog {
 public:
  // `store` outlives the log; it is read (watch pages, counts) and thinned, never saved to.
  JobEventLog(common::Clock* clock, JobStore* store, int64_t max_events_per_job);

  // Follows a job whose history the store holds: `stored_events` events, the newest numbered
  // `last_sequence`.
  void AddJob(const std::string& job_id, int64_t last_sequence, int64_t stored_events);
  // Appends an event to a job added before (sequence, time and job id filled in) and returns it.
  v1::JobEvent& Add(const std::string& job_id, v1::JobEvent event);
  // The events added since the last Persisted(), in the order they were added.
  const std::vector<v1::JobEvent>& unpersisted() const { return unpersisted_; }
  // The caller saved unpersisted(): each event goes to its job's sinks; the sinks of the jobs in
  // `ended_jobs` (final states) are then ended; the jobs are thinned past the bound.
  void Persisted(const absl::flat_hash_set<std::string>& ended_jobs);

  // One page of a job's stored history for `sink`: up to `max_events` events after
  // `after_sequence`. On a short page the sink follows the job from then on (or is ended at once
  // when `job_ended`), in the same step, so no event is missed or sent twice (see
  // JobManager::WatchPage).
  absl::StatusOr<WatchPosition> WatchPage(const std::string& job_id, int64_t after_sequence,
                                          int64_t max_events, bool job_ended,
                                          std::shared_ptr<JobEventSink> sink);
  // Stops sending `sink` the job's events.
  void Unwatch(const std::string& job_id, const JobEventSink* sink);
  // Sinks held, over all jobs.
  int64_t watchers() const;

 private:
  struct JobEvents {
    // The sequence of the newest event added.
    int64_t last_sequence = 0;
    // Events added but not yet durable, so not yet sent to the sinks (in sequence order).
    std::vector<v1::JobEvent> unpublished;
    // Events in the store, thinned past max_events_per_job_.
    int64_t stored = 0;
    // Thin() runs a pass once `stored` exceeds this.
    int64_t thin_above = 0;
    std::vector<std::shared_ptr<JobEventSink>> sinks;
  };

  // Sends the job's events that just became durable to its sinks; ends the sinks if `ended`.
  void Publish(JobEvents& job, bool ended);
  void Thin(const std::string& job_id, JobEvents& job);

  common::Clock* const clock_;
  JobStore* const store_;
  const int64_t max_events_per_job_;
  // By job id; the history itself lives in the store, so memory does not grow with it.
  absl::flat_hash_map<std::string, JobEvents> jobs_;
  // Events added since the last Persisted().
  std::vector<v1::JobEvent> unpersisted_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_JOB_EVENT_LOG_H_
