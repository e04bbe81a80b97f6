// A training run's step metrics (step_metrics.h).
#include "worker/daemon/step_metrics.h"

#include <time.h>

#include <algorithm>

#include "common/process_memory.h"
#include "jobspec/job_plan.h"

namespace zeroshard::worker {
namespace {

// Cumulative CPU time of `clock`, nanoseconds; 0 where the clock cannot be read.
int64_t CpuNanoseconds(clockid_t clock) {
  timespec time;
  if (clock_gettime(clock, &time) != 0) return 0;
  return int64_t{time.tv_sec} * 1000000000 + time.tv_nsec;
}

// A clock that could not be read at one end reads 0 there: never report a negative time.
double NanosecondsToMs(int64_t ns) { return static_cast<double>(std::max<int64_t>(0, ns)) / 1e6; }

}  // namespace

CpuClocks CpuClocks::Read(const comm::Communicator& communicator) {
  CpuClocks clocks;
  clocks.training_thread_ns = CpuNanoseconds(CLOCK_THREAD_CPUTIME_ID);
  clocks.comm_thread_ns = communicator.stats().thread_cpu_ns;
  clocks.process_ns = CpuNanoseconds(CLOCK_PROCESS_CPUTIME_ID);
  return clocks;
}

v1::StepMetrics MetricsFor(const engine::StepResult& result, int64_t steps_done,
                           const IterationTimes& times, const OutsideEngineMemory& outside,
                           int64_t vmrss_at_start_bytes) {
  v1::StepMetrics metrics;
  metrics.set_step(steps_done);
  metrics.set_loss(result.global_loss);
  metrics.set_step_ms(result.timings.step_ms);
  metrics.set_comm_ms(result.timings.comm_ms);
  metrics.set_exposed_comm_ms(result.timings.exposed_comm_ms);
  metrics.set_update_ms(result.timings.update_ms);
  metrics.set_allgather_ms(result.timings.allgather_ms);
  metrics.set_param_wait_ms(result.timings.param_wait_ms);
  metrics.set_grad_norm(result.grad_norm);
  metrics.set_loss_scale(result.loss_scale);
  metrics.set_skipped(result.skipped);
  metrics.set_iteration_ms(absl::ToDoubleMilliseconds(times.iteration));
  metrics.set_compute_ms(absl::ToDoubleMilliseconds(times.compute));
  const absl::Span<const engine::BucketWait> waits = result.timings.bucket_waits;
  if (waits.size() <= static_cast<size_t>(jobspec::kMaxReportedBuckets)) {
    for (const engine::BucketWait& wait : waits) {
      metrics.add_bucket_exposed_ms(wait.backward_ms + wait.step_ms);
      metrics.add_bucket_exposed_in_backward_ms(wait.backward_ms);
    }
  }
  metrics.set_compute_thread_cpu_ms(NanosecondsToMs(times.training_thread_cpu_ns));
  metrics.set_comm_thread_cpu_ms(NanosecondsToMs(times.comm_thread_cpu_ns));
  metrics.set_process_cpu_ms(NanosecondsToMs(times.process_cpu_ns));
  v1::MemoryBreakdown& memory = *metrics.mutable_memory();
  using engine::MemoryCategory;
  memory.set_params_bytes(result.memory.of(MemoryCategory::kParams));
  memory.set_grads_bytes(result.memory.of(MemoryCategory::kGrads));
  memory.set_master_bytes(result.memory.of(MemoryCategory::kMaster));
  memory.set_optimizer_state_bytes(result.memory.of(MemoryCategory::kOptimizerState));
  memory.set_bucket_bytes(result.memory.of(MemoryCategory::kBuckets));
  memory.set_comm_scratch_bytes(result.memory.of(MemoryCategory::kCommScratch));
  memory.set_gather_pool_bytes(result.memory.of(MemoryCategory::kGatherPool));
  memory.set_comm_staging_bytes(outside.comm_staging_bytes);
  memory.set_workload_bytes(outside.workload_bytes);
  memory.set_kernel_tables_bytes(outside.kernel_tables_bytes);
  memory.set_checkpoint_staging_bytes(outside.checkpoint_staging_bytes);
  memory.set_total_bytes(result.memory.total() + outside.comm_staging_bytes +
                         outside.workload_bytes + outside.kernel_tables_bytes +
                         outside.checkpoint_staging_bytes);
  // Figures the kernel does not give (no procfs) stay 0 rather than failing the step.
  if (absl::StatusOr<common::ProcessMemory> process = common::ReadProcessMemory(); process.ok()) {
    metrics.set_vmhwm_bytes(process->vmhwm_bytes);
    metrics.set_vmrss_bytes(process->vmrss_bytes);
  }
  metrics.set_vmrss_at_start_bytes(vmrss_at_start_bytes);
  return metrics;
}

}  // namespace zeroshard::worker
