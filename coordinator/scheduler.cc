// FIFO gang scheduler with backfill and a reservation, pinned placements for attached jobs, and
// former members first for recovering jobs.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::coordinator {

int64_t ChooseWorldSize(const PendingJob& job, int64_t available) {
  const int64_t upper = std::min(job.max_workers, available);
  for (int64_t w = upper; w >= job.min_workers && w >= 1; --w) {
    if (job.global_batch % w == 0) return w;
  }
  return 0;
}

int64_t SmallestWorldSize(const PendingJob& job) {
  for (int64_t w = std::max<int64_t>(job.min_workers, 1); w <= job.max_workers; ++w) {
    if (job.global_batch % w == 0) return w;
  }
  return 0;
}

namespace {

// Why `job` cannot start on `live` workers however long it waits, or "" if it could.
std::string UnschedulableReason(const PendingJob& job, int64_t live) {
  const std::string kind = v1::DeviceKind_Name(job.device_kind);
  const int64_t smallest = SmallestWorldSize(job);
  if (smallest == 0) {
    return absl::StrCat(kUnschedulablePrefix, "no world size in [min_workers ", job.min_workers,
                        ", max_workers ", job.max_workers, "] divides global_batch ",
                        job.global_batch);
  }
  if (smallest <= live) return "";
  return absl::StrCat(kUnschedulablePrefix, "needs ", smallest, " ", kind,
                      " workers and the cluster has ", live,
                      " live; it waits for more to register and holds none meanwhile");
}

// The free workers of one device kind in placement order (grouped by host), and which of them
// this pass has given out or held already. Not thread-safe: local to one Schedule call.
class WorkerPool {
 public:
  void Add(const FreeWorker* worker) {
    workers_.push_back(worker);
    taken_.push_back(false);
    ++available_;
  }
  // Stable: registration order within a host.
  void GroupByHost() {
    std::stable_sort(workers_.begin(), workers_.end(),
                     [](const FreeWorker* a, const FreeWorker* b) { return a->host < b->host; });
  }
  size_t size() const { return workers_.size(); }
  const FreeWorker& worker(size_t index) const { return *workers_[index]; }
  bool taken(size_t index) const { return taken_[index]; }
  int64_t available() const { return available_; }

  void Take(size_t index) {
    taken_[index] = true;
    --available_;
  }
  // Workers not taken yet whose memory limit is none or at least `need_bytes`.
  int64_t AvailableFitting(int64_t need_bytes) const {
    int64_t fitting = 0;
    for (size_t index = 0; index < workers_.size(); ++index) {
      if (!taken_[index] && Fits(index, need_bytes)) ++fitting;
    }
    return fitting;
  }
  bool AnyLimit() const {
    return absl::c_any_of(workers_,
                          [](const FreeWorker* worker) { return worker->memory_limit_bytes > 0; });
  }

  // `count` workers not taken yet whose limit fits `need_bytes`: those at the `preferred`
  // indices first, then the first others in order. Returned in pool order: a subsequence of
  // host-grouped workers is still host-grouped, so each job's ranks keep a host's workers
  // contiguous.
  std::vector<std::string> TakeFirst(int64_t count, std::vector<size_t> preferred = {},
                                     int64_t need_bytes = 0) {
    std::vector<size_t> chosen;
    chosen.reserve(count);
    std::sort(preferred.begin(), preferred.end());
    preferred.erase(std::unique(preferred.begin(), preferred.end()), preferred.end());
    for (size_t index : preferred) {
      if (static_cast<int64_t>(chosen.size()) == count) break;
      if (!taken_[index] && Fits(index, need_bytes)) chosen.push_back(index);
    }
    const size_t preferred_chosen = chosen.size();
    for (size_t index = first_untaken_;
         static_cast<int64_t>(chosen.size()) < count && index < workers_.size(); ++index) {
      if (taken_[index] || !Fits(index, need_bytes) ||
          std::binary_search(chosen.begin(), chosen.begin() + preferred_chosen, index)) {
        continue;
      }
      chosen.push_back(index);
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<std::string> ids;
    ids.reserve(chosen.size());
    for (size_t index : chosen) {
      ids.push_back(workers_[index]->worker_id);
      Take(index);
    }
    while (first_untaken_ < taken_.size() && taken_[first_untaken_]) ++first_untaken_;
    return ids;
  }

  // A job that waited too long for workers of this kind holds them all: no later job gets one.
  void Reserve() { reserved_ = true; }
  bool reserved() const { return reserved_; }

 private:
  bool Fits(size_t index, int64_t need_bytes) const {
    const int64_t limit = workers_[index]->memory_limit_bytes;
    return limit == 0 || limit >= need_bytes;
  }

  std::vector<const FreeWorker*> workers_;
  std::vector<bool> taken_;
  int64_t available_ = 0;
  // Every worker before it is taken: TakeFirst resumes here.
  size_t first_untaken_ = 0;
  bool reserved_ = false;
};

struct PoolSlot {
  WorkerPool* pool = nullptr;
  size_t index = 0;
};

}  // namespace

ScheduleResult Schedule(const std::vector<PendingJob>& pending,
                        const std::vector<FreeWorker>& free_workers,
                        const LiveWorkerCounts& live_workers, absl::Time now,
                        const SchedulerOptions& options) {
  std::map<v1::DeviceKind, WorkerPool> pools;
  for (const FreeWorker& worker : free_workers) pools[worker.device_kind].Add(&worker);
  for (auto& [kind, pool] : pools) pool.GroupByHost();
  // Where each free worker is, for pinned jobs and preferred workers; built only when a job has
  // either.
  absl::flat_hash_map<std::string, PoolSlot> slot_by_id;
  if (absl::c_any_of(pending, [](const PendingJob& job) {
        return !job.pinned_worker_ids.empty() || !job.preferred_worker_ids.empty();
      })) {
    for (auto& [kind, pool] : pools) {
      for (size_t i = 0; i < pool.size(); ++i) slot_by_id[pool.worker(i).worker_id] = {&pool, i};
    }
  }
  ScheduleResult result;
  std::vector<Placement>& placements = result.placements;
  for (const PendingJob& job : pending) {
    if (job.pinned_worker_ids.empty() && !job.regrouping) {
      // Neither a reservation (it could never use it: its kind's workers would sit idle
      // forever) nor a place in the queue that blocks anyone.
      const auto live = live_workers.find(job.device_kind);
      std::string unschedulable =
          UnschedulableReason(job, live == live_workers.end() ? 0 : live->second);
      if (!unschedulable.empty()) {
        result.unschedulable.push_back({job.job_id, std::move(unschedulable)});
        continue;
      }
    }
    WorkerPool& pool = pools[job.device_kind];
    if (pool.reserved()) continue;
    const bool waited_too_long = now - job.pending_since >= options.max_backfill_wait;
    if (!job.pinned_worker_ids.empty()) {
      std::vector<size_t> free_slots;
      for (const std::string& id : job.pinned_worker_ids) {
        const auto it = slot_by_id.find(id);
        if (it == slot_by_id.end() || it->second.pool != &pool || pool.taken(it->second.index)) {
          continue;
        }
        free_slots.push_back(it->second.index);
      }
      if (free_slots.size() == job.pinned_worker_ids.size()) {
        for (size_t index : free_slots) pool.Take(index);
        placements.push_back({job.job_id, job.pinned_worker_ids});
      } else if (waited_too_long) {
        for (size_t index : free_slots) pool.Take(index);
      }
      continue;
    }
    std::vector<size_t> preferred;
    for (const std::string& id : job.preferred_worker_ids) {
      const auto it = slot_by_id.find(id);
      if (it == slot_by_id.end() || it->second.pool != &pool || pool.taken(it->second.index)) {
        continue;
      }
      preferred.push_back(it->second.index);
    }
    if (job.regrouping) {
      for (size_t index : preferred) {
        if (!pool.taken(index)) pool.Take(index);
      }
      continue;
    }
    int64_t world_size = ChooseWorldSize(job, pool.available());
    if (world_size == 0) {
      if (waited_too_long) pool.Reserve();
      continue;
    }
    // Workers whose memory limit is below the need at W are left out. Fewer workers give a
    // smaller W and a larger need, so W shrinks until enough fit or none does (W strictly
    // decreases: the loop ends). A job no worker's limit admits waits without a reservation:
    // holding the kind's workers would not make them larger.
    int64_t need_bytes = 0;
    if (job.memory_need_bytes && pool.AnyLimit()) {
      while (world_size != 0) {
        need_bytes = job.memory_need_bytes(world_size);
        const int64_t fitting = pool.AvailableFitting(need_bytes);
        if (fitting >= world_size) break;
        world_size = ChooseWorldSize(job, fitting);
      }
      if (world_size == 0) continue;
    }
    placements.push_back(
        {job.job_id, pool.TakeFirst(world_size, std::move(preferred), need_bytes)});
  }
  return result;
}

absl::StatusOr<std::vector<std::string>> PinnedWorkerIds(
    const v1::JobSpec& spec,
    const absl::flat_hash_map<std::string, const v1::WorkerInfo*>& live_by_name) {
  const v1::AttachedModel& attached = spec.workload().attached();
  std::vector<std::string> ids;
  ids.reserve(attached.workers_size());
  for (int rank = 0; rank < attached.workers_size(); ++rank) {
    const auto it = live_by_name.find(attached.workers(rank));
    if (it == live_by_name.end()) {
      ids.emplace_back();
      continue;
    }
    const v1::WorkerInfo& worker = *it->second;
    const std::string which = absl::StrCat("workload.attached.workers[", rank, "]: worker ",
                                           worker.name(), " (", worker.id(), ")");
    if (worker.attach_socket().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(which,
                       " registered without an attach_socket, so no trainer can attach "
                       "to it"));
    }
    if (worker.device_kind() != spec.device_kind()) {
      return absl::FailedPreconditionError(absl::StrCat(
          which, " is a ", v1::DeviceKind_Name(worker.device_kind()),
          " worker; the job's device_kind is ", v1::DeviceKind_Name(spec.device_kind())));
    }
    ids.push_back(worker.id());
  }
  return ids;
}

}  // namespace zeroshard::coordinator
