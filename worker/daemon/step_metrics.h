// What one step of a training run reports to the coordinator (v1::StepMetrics): the engine's
// step result with the iteration's wall and CPU times and the memory held outside the engine.
#ifndef ZEROSHARD_WORKER_DAEMON_STEP_METRICS_H_
#define ZEROSHARD_WORKER_DAEMON_STEP_METRICS_H_

#include <cstdint>

#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/engine/engine.h"
#include "zeroshard/v1/types.pb.h"

namespace zeroshard::worker {

// Memory a run holds outside the engine's allocator, by owner.
struct OutsideEngineMemory {
  int64_t comm_staging_bytes = 0;        // the communicator's (CommunicatorStats::scratch_bytes)
  int64_t workload_bytes = 0;            // Workload::BufferBytes
  int64_t kernel_tables_bytes = 0;       // DeviceOps::KernelTableBytes
  int64_t checkpoint_staging_bytes = 0;  // CheckpointWriter::staging_bytes
};

// Wall times of one iteration's parts, and the CPU time it used.
struct IterationTimes {
  absl::Duration compute;    // the workload's forward and backward
  absl::Duration iteration;  // compute plus the engine's step
  int64_t training_thread_cpu_ns = 0;
  int64_t comm_thread_cpu_ns = 0;
  int64_t process_cpu_ns = 0;
};

// CPU clocks read at one moment of the training thread.
struct CpuClocks {
  int64_t training_thread_ns = 0;
  int64_t comm_thread_ns = 0;
  int64_t process_ns = 0;

  // The training thread's and the process's clocks now, and `communicator`'s thread's.
  static CpuClocks Read(const comm::Communicator& communicator);
};

// The step's metrics: `steps_done` steps are done; the process's VmHWM and VmRSS are read now
// (0 where the kernel does not give them).
v1::StepMetrics MetricsFor(const engine::StepResult& result, int64_t steps_done,
                           const IterationTimes& times, const OutsideEngineMemory& outside,
                           int64_t vmrss_at_start_bytes);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_STEP_METRICS_H_
