// FIFO gang scheduler with bounded backfill.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>

namespace zeroshard::coordinator {

int64_t ChooseWorldSize(const PendingJob& job, int64_t available) {
  const int64_t upper = std::min(job.max_workers, available);
  for (int64_t w = upper; w >= job.min_workers && w >= 1; --w) {
    if (job.global_batch % w == 0) return w;
  }
  return 0;
}

std::vector<Placement> Schedule(const std::vector<PendingJob>& pending,
                                const std::vector<FreeWorker>& free_workers, absl::Time now,
                                const SchedulerOptions& options) {
  // Free workers per device kind, grouped by host (stable: registration order within a host).
  std::map<v1::DeviceKind, std::vector<const FreeWorker*>> free_by_kind;
  for (const FreeWorker& worker : free_workers) {
    free_by_kind[worker.device_kind].push_back(&worker);
  }
  for (auto& [kind, workers] : free_by_kind) {
    std::stable_sort(workers.begin(), workers.end(),
                     [](const FreeWorker* a, const FreeWorker* b) { return a->host < b->host; });
  }
  std::map<v1::DeviceKind, bool> reserved;
  std::map<v1::DeviceKind, size_t> taken;
  std::vector<Placement> placements;
  for (const PendingJob& job : pending) {
    if (reserved[job.device_kind]) continue;
    std::vector<const FreeWorker*>& workers = free_by_kind[job.device_kind];
    size_t& used = taken[job.device_kind];
    const int64_t world_size = ChooseWorldSize(job, static_cast<int64_t>(workers.size() - used));
    if (world_size == 0) {
      if (now - job.pending_since >= options.max_backfill_wait) reserved[job.device_kind] = true;
      continue;
    }
    Placement placement;
    placement.job_id = job.job_id;
    for (int64_t i = 0; i < world_size; ++i) {
      placement.worker_ids.push_back(workers[used + i]->worker_id);
    }
    used += world_size;
    placements.push_back(std::move(placement));
  }
  return placements;
}

}  // namespace zeroshard::coordinator
