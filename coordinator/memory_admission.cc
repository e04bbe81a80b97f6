// Admission by memory (memory_admission.h).
#include "coordinator/memory_admission.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/scheduler.h"
#include "jobspec/job_memory.h"
#include "jobspec/job_spec_defaults.h"
#include "sharding/rank_memory.h"

namespace zeroshard::coordinator {

int64_t AdmissionWorldSize(const v1::JobSpec& spec, int64_t idle) {
  PendingJob job;
  job.min_workers = spec.min_workers();
  job.max_workers = spec.max_workers();
  job.global_batch = spec.global_batch();
  const int64_t world_size = ChooseWorldSize(job, idle);
  return world_size != 0 ? world_size : SmallestWorldSize(job);
}

absl::Status CheckJobFitsMemoryLimits(const v1::JobSpec& spec,
                                      const std::vector<const v1::WorkerInfo*>& idle_workers) {
  // An attached job runs on the workers it names, and only there.
  const auto& pinned = spec.workload().attached().workers();
  const v1::WorkerInfo* smallest = nullptr;
  int64_t idle = 0;
  for (const v1::WorkerInfo* worker : idle_workers) {
    if (worker->device_kind() != spec.device_kind()) continue;
    if (spec.workload().has_attached() &&
        std::find(pinned.begin(), pinned.end(), worker->name()) == pinned.end()) {
      continue;
    }
    ++idle;
    if (worker->memory_limit_bytes() > 0 &&
        (smallest == nullptr || worker->memory_limit_bytes() < smallest->memory_limit_bytes())) {
      smallest = worker;
    }
  }
  if (smallest == nullptr) return absl::OkStatus();
  const int64_t world_size = AdmissionWorldSize(spec, idle);
  if (world_size == 0) return absl::OkStatus();  // validation refuses such jobs
  const int64_t limit = smallest->memory_limit_bytes();
  absl::StatusOr<sharding::RankMemoryBytes> need =
      jobspec::JobMemoryNeed(spec, spec.mode(), world_size);
  // A job that cannot be planned fails where it is planned, with that error.
  if (!need.ok() || need->total <= limit) return absl::OkStatus();
  std::string message =
      absl::StrCat("spec.mode: ", v1::Mode_Name(spec.mode()), " needs ",
                   sharding::FormatMiB(need->total), " per rank at W=", world_size, " (",
                   need->Breakdown(), "), more than worker ", smallest->name(),
                   "'s --memory_limit_bytes=", sharding::FormatMiB(limit), " (", limit, " bytes)");
  // The other modes' totals, the ones that fit first: what the submitter can change to.
  // A job at its mode's default bucket size is estimated in each other mode at that mode's
  // (an attached zero3 job's default is smaller).
  const bool default_buckets = spec.bucket_elems() == jobspec::DefaultBucketElems(spec);
  std::string fitting;
  std::string too_large;
  for (v1::Mode mode : {v1::ZERO3, v1::ZERO2, v1::ZERO1, v1::DDP}) {
    if (mode == spec.mode()) continue;
    v1::JobSpec in_mode = spec;
    in_mode.set_mode(mode);
    if (default_buckets) in_mode.set_bucket_elems(jobspec::DefaultBucketElems(in_mode));
    absl::StatusOr<sharding::RankMemoryBytes> other =
        jobspec::JobMemoryNeed(in_mode, mode, world_size);
    if (!other.ok()) continue;
    std::string& list = other->total <= limit ? fitting : too_large;
    absl::StrAppend(&list, list.empty() ? "" : ", ", v1::Mode_Name(mode), " would need ",
                    sharding::FormatMiB(other->total));
  }
  if (!fitting.empty()) {
    absl::StrAppend(&message, "; ", fitting, " (fits)");
  } else {
    absl::StrAppend(&message, "; no mode fits at W=", world_size,
                    too_large.empty() ? "" : absl::StrCat(" (", too_large, ")"));
  }
  return absl::ResourceExhaustedError(message);
}

}  // namespace zeroshard::coordinator
