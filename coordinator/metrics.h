// Coordinator metrics in Prometheus text format: RPC counts by code and latency histograms,
// workers and jobs by state, heartbeat lag.
#ifndef ZEROSHARD_COORDINATOR_METRICS_H_
#define ZEROSHARD_COORDINATOR_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/job_manager.h"

namespace zeroshard::coordinator {

// Thread-safe. RecordRpc is on every RPC's path: one short critical section.
class CoordinatorMetrics {
 public:
  // Latency histogram upper bounds, seconds.
  static constexpr std::array<double, 10> kBuckets = {0.0001, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,  0.1,   0.5,    2.5};

  void RecordRpc(const std::string& method, absl::StatusCode code, absl::Duration latency);

  // The whole exposition, with `stats` for the gauges.
  std::string RenderPrometheus(const ManagerStats& stats) const;

 private:
  struct MethodStats {
    std::map<absl::StatusCode, int64_t> count_by_code;
    std::array<int64_t, kBuckets.size()> bucket_counts{};
    int64_t count = 0;
    double sum_seconds = 0;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, MethodStats> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_METRICS_H_
