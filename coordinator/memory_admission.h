// Admission by memory: a job whose mode needs more per rank than a worker's --memory_limit_bytes
// is refused at submission (naming the figures and a mode that would fit), and is never placed
// on a worker whose limit is below its need.
#ifndef ZEROSHARD_COORDINATOR_MEMORY_ADMISSION_H_
#define ZEROSHARD_COORDINATOR_MEMORY_ADMISSION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/worker.pb.h"

namespace zeroshard::coordinator {

// The world size the scheduler would give `spec` (defaults applied) with `idle` free workers of
// its kind: the largest W in [min_workers, max_workers] dividing global_batch and at most `idle`;
// with too few idle workers for any, the smallest such W. 0 when no W divides global_batch.
int64_t AdmissionWorldSize(const v1::JobSpec& spec, int64_t idle);

// OK, or RESOURCE_EXHAUSTED when `spec` (defaults applied, validated) needs
// more per rank at AdmissionWorldSize than the smallest memory_limit_bytes among `idle_workers`
// of its device kind that have one, e.g. "spec.mode: ZERO2 needs 412.0 MiB per rank at W=4
// (params=..., ...), more than worker w3's --memory_limit_bytes=300.0 MiB; ZERO3 would need
// 190.2 MiB". An attached job is checked against the workers it names (its W is their count).
// Workers of other kinds, and workers without a limit, are ignored.
absl::Status CheckJobFitsMemoryLimits(const v1::JobSpec& spec,
                                      const std::vector<const v1::WorkerInfo*>& idle_workers);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_MEMORY_ADMISSION_H_
