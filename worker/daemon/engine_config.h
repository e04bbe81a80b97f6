// The engine configuration of a job: a JobSpec's mode, optimizer and every PrecisionSpec field
// mapped onto engine::EngineConfig, for the worker's training run.
#ifndef ZEROSHARD_WORKER_DAEMON_ENGINE_CONFIG_H_
#define ZEROSHARD_WORKER_DAEMON_ENGINE_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "sharding/shard_planner.h"
#include "worker/engine/engine.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::worker {

// `spec` arrives with defaults applied (jobspec::WithDefaults) and validated; `threads` run the
// optimizer kernels. Every PrecisionSpec field is used: the three dtypes, master_dtype (fp32 is
// the engine's only master dtype), and the loss scale's initial value, dynamic flag, growth
// interval, backoff and growth factors. InvalidArgument naming the field for a mode, optimizer
// or dtype this worker does not support (e.g. FLOAT64 parameters).
absl::StatusOr<engine::EngineConfig> EngineConfigForJob(const v1::JobSpec& spec, int threads);

// The parameter group of each of `plan`'s tensors, as an attached trainer numbers the groups in
// its step requests (attach.proto, StepRequest.param_groups): 0 for the default group (tensors
// no ParamGroup matches), i + 1 for spec.param_groups[i] (first match wins).
std::vector<int32_t> TensorGroupsForPlan(const v1::JobSpec& spec, const sharding::ShardPlan& plan);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_ENGINE_CONFIG_H_
