// The job manager's event log: sequence numbers, durable-then-publish, thinning and watch pages.
#include "coordinator/job_event_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "google/protobuf/util/time_util.h"

namespace zeroshard::coordinator {

v1::JobEvent Notice(int64_t generation, std::string message) {
  v1::JobEvent event;
  event.set_type(v1::NOTICE);
  event.set_generation(generation);
  event.set_message(std::move(message));
  return event;
}

JobEventLog::JobEventLog(common::Clock* clock, JobStore* store, int64_t max_events_per_job)
    : clock_(clock), store_(store), max_events_per_job_(max_events_per_job) {}

void JobEventLog::AddJob(const std::string& job_id, int64_t last_sequence, int64_t stored_events) {
  JobEvents& job = jobs_[job_id];
  job.last_sequence = last_sequence;
  job.stored = stored_events;
  job.thin_above = max_events_per_job_;
}

v1::JobEvent& JobEventLog::Add(const std::string& job_id, v1::JobEvent event) {
  JobEvents& job = jobs_[job_id];
  event.set_job_id(job_id);
  event.set_sequence(++job.last_sequence);
  *event.mutable_time() =
      google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(clock_->Now()));
  unpersisted_.push_back(event);
  job.unpublished.push_back(std::move(event));
  return job.unpublished.back();
}

void JobEventLog::Persisted(const absl::flat_hash_set<std::string>& ended_jobs) {
  // Durable now: watchers may see them.
  std::vector<std::string> published_jobs;
  for (const v1::JobEvent& event : unpersisted_) {
    if (published_jobs.empty() || published_jobs.back() != event.job_id()) {
      published_jobs.push_back(event.job_id());
    }
  }
  unpersisted_.clear();
  for (const std::string& job_id : published_jobs) {
    if (auto it = jobs_.find(job_id); it != jobs_.end()) {
      Publish(it->second, ended_jobs.contains(job_id));
      Thin(job_id, it->second);
    }
  }
}

void JobEventLog::Publish(JobEvents& job, bool ended) {
  for (const v1::JobEvent& event : job.unpublished) {
    job.sinks.erase(std::remove_if(job.sinks.begin(), job.sinks.end(),
                                   [&](const std::shared_ptr<JobEventSink>& sink) {
                                     return !sink->OnEvent(event);
                                   }),
                    job.sinks.end());
  }
  job.stored += static_cast<int64_t>(job.unpublished.size());
  job.unpublished.clear();
  if (!ended) return;
  for (const std::shared_ptr<JobEventSink>& sink : job.sinks) sink->OnJobEnded();
  job.sinks.clear();
}

void JobEventLog::Thin(const std::string& job_id, JobEvents& job) {
  if (job.stored <= job.thin_above) return;
  absl::StatusOr<int64_t> deleted = store_->ThinProgressEvents(job_id);
  if (!deleted.ok()) {
    // Nothing is lost but disk space; the next event tries again.
    ZS_LOG(ERROR) << "state store: cannot thin the events of " << job_id << ": "
                  << deleted.status();
    return;
  }
  job.stored -= *deleted;
  // A history of mostly other events may stay above the limit: then the next pass waits for a
  // quarter of the limit of new events rather than rescanning the history on every event.
  job.thin_above =
      job.stored > max_events_per_job_ ? job.stored + max_events_per_job_ / 4 : max_events_per_job_;
}

absl::StatusOr<WatchPosition> JobEventLog::WatchPage(const std::string& job_id,
                                                     int64_t after_sequence, int64_t max_events,
                                                     bool job_ended,
                                                     std::shared_ptr<JobEventSink> sink) {
  // Under the manager's lock the store holds exactly the published events: Persisted() is called
  // after the save, before the lock is released, and an unsaved event is in neither.
  absl::StatusOr<std::vector<v1::JobEvent>> page =
      store_->LoadEvents(job_id, after_sequence, max_events);
  if (!page.ok()) {
    return absl::UnavailableError(
        absl::StrCat("state store: cannot read the job's events: ", page.status().message()));
  }
  WatchPosition position;
  position.last_sequence = after_sequence;
  for (const v1::JobEvent& event : *page) {
    if (!sink->OnEvent(event)) return position;
    position.last_sequence = event.sequence();
  }
  if (static_cast<int64_t>(page->size()) == max_events) return position;
  position.following = true;
  JobEvents& job = jobs_[job_id];
  if (job_ended && job.unpublished.empty()) {
    sink->OnJobEnded();
  } else {
    job.sinks.push_back(std::move(sink));
  }
  return position;
}

void JobEventLog::Unwatch(const std::string& job_id, const JobEventSink* sink) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  std::vector<std::shared_ptr<JobEventSink>>& sinks = it->second.sinks;
  sinks.erase(std::remove_if(
                  sinks.begin(), sinks.end(),
                  [sink](const std::shared_ptr<JobEventSink>& held) { return held.get() == sink; }),
              sinks.end());
}

int64_t JobEventLog::watchers() const {
  int64_t watchers = 0;
  for (const auto& [job_id, job] : jobs_) watchers += static_cast<int64_t>(job.sinks.size());
  return watchers;
}

}  // namespace zeroshard::coordinator
