// Runs one job on a fresh local cluster and measures its worker processes' memory around it (RSS
// before the job, peak RSS after it), for the memory accounting test and tests/bench:memory_bench.
#ifndef ZEROSHARD_TESTS_INTEGRATION_MEMORY_RUN_H_
#define ZEROSHARD_TESTS_INTEGRATION_MEMORY_RUN_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/local_cluster.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::testing {

// One worker process of the job, as /proc/<pid>/status saw it.
struct WorkerMemory {
  std::string worker_id;
  pid_t pid = -1;
  // VmRSS once the worker was idle, before the job was submitted.
  int64_t vmrss_before_bytes = 0;
  // VmHWM after the job ended: the peak since its run started (the worker resets its peak when a
  // run starts), so the job's peak.
  int64_t vmhwm_bytes = 0;

  int64_t growth_bytes() const { return vmhwm_bytes - vmrss_before_bytes; }
};

struct MeasuredJob {
  // The job as the coordinator reports it once it ended; `progress` is rank 0's last step,
  // whose `memory` is rank 0's counted categories.
  v1::Job job;
  // The job's workers, by rank.
  std::vector<WorkerMemory> ranks;
};

// Starts a LocalCluster (`options`) of spec.max_workers() fresh workers, samples each worker's
// VmRSS once all are idle, submits `spec`, waits (up to `deadline`) for the job to end, samples
// each worker's VmHWM and stops the cluster. FailedPrecondition (with the job's message) when the
// job did not succeed; the cluster's errors otherwise. Not thread-safe: one at a time per
// process (it owns the cluster for the call).
absl::StatusOr<MeasuredJob> RunJobMeasuringMemory(const v1::JobSpec& spec,
                                                  const LocalClusterOptions& options,
                                                  absl::Duration deadline);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_INTEGRATION_MEMORY_RUN_H_
