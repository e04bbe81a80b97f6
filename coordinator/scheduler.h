// Gang scheduling, FIFO with backfill and a reservation: a pure function from the pending jobs, the
// free workers and the live worker counts to the jobs that start now and the workers (in rank
// order) each one gets, and the jobs that cannot start however long they wait. Jobs pinned
// to particular workers (attached jobs) start on exactly those; a job recovering from a lost
// worker gets its former members before any other worker, and can hold them while it waits for
// the rest to come back.
#ifndef ZEROSHARD_COORDINATOR_SCHEDULER_H_
#define ZEROSHARD_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/types.pb.h"
#include "zeroshard/v1/worker.pb.h"

namespace zeroshard::coordinator {

struct PendingJob {
  std::string job_id;
  v1::DeviceKind device_kind = v1::CPU;
  int64_t min_workers = 1;
  int64_t max_workers = 1;
  int64_t global_batch = 1;
  // When the job became pending (submission or the end of its last generation).
  absl::Time pending_since;
  // Set for a job pinned to its workers (an attached job): the worker id of each rank, in rank
  // order, each a different worker, or "" for a rank whose worker is not registered (live) now. The
  // job starts on exactly these workers once every one is free, and its min/max_workers and
  // global_batch are not used. Empty: the scheduler picks the workers.
  std::vector<std::string> pinned_worker_ids;
  // Free workers this job gets before any other (after a lost worker ended its generation: the
  // members of that generation that are free again), each a different worker; ids that are not
  // free workers of its kind are ignored. Its world size is chosen as for any job.
  std::vector<std::string> preferred_worker_ids;
  // The job waits for more of its former members to come back: it does not start now, and its
  // free preferred workers are held for it (no job after it gets them). Not used for a pinned
  // job.
  bool regrouping = false;
  // Bytes one rank of this job needs at a world size (jobspec::JobMemoryNeed), compared with the
  // workers' memory_limit_bytes: a worker whose limit is below the need at the chosen W is not
  // given the job (it starts on fewer workers, or waits). Null: no need is checked (e.g. attached
  // jobs). Called only when some free worker of the job's kind has a limit.
  std::function<int64_t(int64_t world_size)> memory_need_bytes;
};

struct FreeWorker {
  std::string worker_id;
  std::string host;
  v1::DeviceKind device_kind = v1::CPU;
  // The worker's --memory_limit_bytes; 0: none.
  int64_t memory_limit_bytes = 0;
};

struct Placement {
  std::string job_id;
  // Rank order: workers of one host are contiguous.
  std::vector<std::string> worker_ids;
};

struct SchedulerOptions {
  // Policy: jobs are considered in FIFO order. A later job may start ahead of an earlier one that
  // does not fit ("backfill") only while that earlier job has been pending for less than this;
  // after that the earlier job reserves the workers of its device kind: the idle ones are held
  // for it, and nothing behind it of that kind starts until it does. With no run-time estimates,
  // backfill could only use workers the reservation does not need, and while it waits it needs
  // every idle one (fewer are idle than it needs). So no job waits behind later ones for longer
  // than this. A job that needs more workers than are live (IDLE or BUSY) of its kind gets no
  // reservation and blocks nobody: it is reported unschedulable until enough workers register.
  // A pinned job that waited this long reserves only its own free workers (they are held for it
  // until the rest are free), not every worker of its device kind: it may wait for a worker that
  // never comes back, and should not stop the whole kind meanwhile. Pinned jobs wait, like any
  // other, behind an earlier job that reserved their device kind.
  absl::Duration max_backfill_wait = absl::Seconds(30);
};

// Live (IDLE or BUSY) workers of each device kind: the most workers a job of that kind could get
// once the running jobs end. Kinds not listed have none.
using LiveWorkerCounts = std::map<v1::DeviceKind, int64_t>;

// Every UnschedulableJob::reason starts with this.
inline constexpr char kUnschedulablePrefix[] = "unschedulable: ";

// A pending job that cannot start however long it waits on the live workers, and why.
struct UnschedulableJob {
  std::string job_id;
  std::string reason;
};

struct ScheduleResult {
  std::vector<Placement> placements;
  // In FIFO order. Pinned and regrouping jobs are never listed (they wait for particular workers
  // to come back).
  std::vector<UnschedulableJob> unschedulable;
};

// The largest W in [min_workers, min(max_workers, available)] that divides global_batch, or 0.
int64_t ChooseWorldSize(const PendingJob& job, int64_t available);

// The smallest W in [min_workers, max_workers] that divides global_batch (the fewest workers the
// job can start on), or 0 if there is none.
int64_t SmallestWorldSize(const PendingJob& job);

// `pending` is in FIFO order; `free_workers` in registration order, unique ids, each also counted
// in `live_workers`. Deterministic.
ScheduleResult Schedule(const std::vector<PendingJob>& pending,
                        const std::vector<FreeWorker>& free_workers,
                        const LiveWorkerCounts& live_workers, absl::Time now,
                        const SchedulerOptions& options = {});

// The worker of each rank of an attached job (spec.workload.attached), by id, from the live
// workers by name ("" where no live worker has the rank's name yet: the job waits for it).
// FAILED_PRECONDITION when a pinned worker is live but cannot run its rank (no attach socket, or
// another device kind): waiting would not change that, since a worker states both when it
// registers.
absl::StatusOr<std::vector<std::string>> PinnedWorkerIds(
    const v1::JobSpec& spec,
    const absl::flat_hash_map<std::string, const v1::WorkerInfo*>& live_by_name);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_SCHEDULER_H_
