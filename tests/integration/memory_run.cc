// RunJobMeasuringMemory: a LocalCluster per job, /proc/<pid>/status around it.
#include "tests/integration/memory_run.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "common/status_macros.h"

namespace zeroshard::testing {
namespace {

bool HasEnded(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

}  // namespace

absl::StatusOr<MeasuredJob> RunJobMeasuringMemory(const v1::JobSpec& spec,
                                                  const LocalClusterOptions& options,
                                                  absl::Duration deadline) {
  const int workers = spec.max_workers();
  if (workers < 1) return absl::InvalidArgumentError("spec.max_workers: must be set");
  LocalCluster cluster(options);
  ZS_RETURN_IF_ERROR(cluster.Start(workers));

  // Every worker by coordinator id, with its RSS before the job.
  std::map<std::string, WorkerMemory> by_id;
  for (int i = 0; i < workers; ++i) {
    ZS_ASSIGN_OR_RETURN(const v1::WorkerInfo info, cluster.FindWorker(absl::StrCat("worker-", i)));
    WorkerMemory worker;
    worker.worker_id = info.id();
    worker.pid = cluster.worker_process(i).pid;
    ZS_ASSIGN_OR_RETURN(const common::ProcessMemory before, common::ReadProcessMemory(worker.pid));
    worker.vmrss_before_bytes = before.vmrss_bytes;
    by_id[worker.worker_id] = worker;
  }

  ZS_ASSIGN_OR_RETURN(const v1::Job submitted, cluster.client().SubmitJob(spec));
  MeasuredJob measured;
  ZS_RETURN_IF_ERROR(cluster.WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = cluster.client().GetJob(submitted.id());
        if (!job.ok()) return false;
        measured.job = *std::move(job);
        return HasEnded(measured.job.state());
      },
      deadline, absl::StrCat(submitted.id(), " ended")));
  if (measured.job.state() != v1::SUCCEEDED) {
    return absl::FailedPreconditionError(
        absl::StrCat(submitted.id(), " ended ", v1::JobState_Name(measured.job.state()), ": ",
                     measured.job.message(), "\n", cluster.LogTails()));
  }
  for (const std::string& id : measured.job.worker_ids()) {
    auto found = by_id.find(id);
    if (found == by_id.end()) {
      return absl::InternalError(absl::StrCat(id, " ran the job but is not a worker started here"));
    }
    WorkerMemory worker = found->second;
    ZS_ASSIGN_OR_RETURN(const common::ProcessMemory after, common::ReadProcessMemory(worker.pid));
    worker.vmhwm_bytes = after.vmhwm_bytes;
    measured.ranks.push_back(worker);
  }
  ZS_RETURN_IF_ERROR(cluster.StopAll());
  return measured;
}

}  // namespace zeroshard::testing
