// Prometheus text exposition of the coordinator's metrics.
#include "coordinator/metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/worker.pb.h"

namespace zeroshard::coordinator {

void CoordinatorMetrics::RecordRpc(const std::string& method, absl::StatusCode code,
                                   absl::Duration latency) {
  const double seconds = absl::ToDoubleSeconds(latency);
  absl::MutexLock lock(&mu_);
  MethodStats& stats = methods_[method];
  ++stats.count_by_code[code];
  ++stats.count;
  stats.sum_seconds += seconds;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) ++stats.bucket_counts[i];
  }
}

std::string CoordinatorMetrics::RenderPrometheus(const ManagerStats& stats) const {
  std::string out;
  absl::StrAppend(&out, "# HELP zeroshard_workers Workers known to the coordinator, by state.\n",
                  "# TYPE zeroshard_workers gauge\n");
  for (int state = v1::IDLE; state <= v1::LEFT; ++state) {
    auto it = stats.workers_by_state.find(state);
    absl::StrAppendFormat(&out, "zeroshard_workers{state=\"%s\"} %d\n",
                          v1::WorkerState_Name(static_cast<v1::WorkerState>(state)),
                          it == stats.workers_by_state.end() ? 0 : it->second);
  }
  absl::StrAppend(&out, "# HELP zeroshard_jobs Jobs, by state.\n", "# TYPE zeroshard_jobs gauge\n");
  for (int state = v1::PENDING; state <= v1::CANCELLED; ++state) {
    auto it = stats.jobs_by_state.find(state);
    absl::StrAppendFormat(&out, "zeroshard_jobs{state=\"%s\"} %d\n",
                          v1::JobState_Name(static_cast<v1::JobState>(state)),
                          it == stats.jobs_by_state.end() ? 0 : it->second);
  }
  absl::StrAppend(&out,
                  "# HELP zeroshard_heartbeat_lag_seconds Longest time since a live worker's "
                  "last heartbeat.\n",
                  "# TYPE zeroshard_heartbeat_lag_seconds gauge\n");
  absl::StrAppendFormat(&out, "zeroshard_heartbeat_lag_seconds %.6f\n",
                        absl::ToDoubleSeconds(stats.max_heartbeat_lag));

  absl::MutexLock lock(&mu_);
  absl::StrAppend(&out, "# HELP zeroshard_rpcs_total RPCs handled, by method and status code.\n",
                  "# TYPE zeroshard_rpcs_total counter\n");
  for (const auto& [method, method_stats] : methods_) {
    for (const auto& [code, count] : method_stats.count_by_code) {
      absl::StrAppendFormat(&out, "zeroshard_rpcs_total{method=\"%s\",code=\"%s\"} %d\n", method,
                            absl::StatusCodeToString(code), count);
    }
  }
  absl::StrAppend(&out, "# HELP zeroshard_rpc_latency_seconds RPC handling latency.\n",
                  "# TYPE zeroshard_rpc_latency_seconds histogram\n");
  for (const auto& [method, method_stats] : methods_) {
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      absl::StrAppendFormat(&out,
                            "zeroshard_rpc_latency_seconds_bucket{method=\"%s\",le=\"%g\"} %d\n",
                            method, kBuckets[i], method_stats.bucket_counts[i]);
    }
    absl::StrAppendFormat(&out,
                          "zeroshard_rpc_latency_seconds_bucket{method=\"%s\",le=\"+Inf\"} %d\n",
                          method, method_stats.count);
    absl::StrAppendFormat(&out, "zeroshard_rpc_latency_seconds_sum{method=\"%s\"} %.6f\n", method,
                          method_stats.sum_seconds);
    absl::StrAppendFormat(&out, "zeroshard_rpc_latency_seconds_count{method=\"%s\"} %d\n", method,
                          method_stats.count);
  }
  return out;
}

}  // namespace zeroshard::coordinator
