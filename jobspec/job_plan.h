// From a job spec to its tensor list and shard plan, and from a plan to its API message. The
// coordinator and the workers both use this, so they agree on the layout hash.
#ifndef ZEROSHARD_JOBSPEC_JOB_PLAN_H_
#define ZEROSHARD_JOBSPEC_JOB_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sharding/shard_planner.h"
#include "sharding/tensor_spec.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/shard_plan.pb.h"

namespace zeroshard::jobspec {

// The format of the plans PlanToProto writes (v1::ShardPlan.plan_version).
inline constexpr int32_t kShardPlanVersion = 2;

// The most buckets a progress report gives figures for one by one (StepMetrics'
// bucket_exposed_ms): workers whose plan has more leave them out, the coordinator refuses more.
inline constexpr int kMaxReportedBuckets = 4096;

// For each of the model's tensors (`names`, in the model's order: workload.attached.tensors'
// for an attached model), the index in spec.param_groups of its group, or -1 for the default
// group: the first group that lists the tensor's index (ParamGroup.tensors) or has a pattern
// matching its name. Costs one pass over the listed indices, plus the patterns per tensor.
std::vector<int> GroupIndexOfEachTensor(const v1::JobSpec& spec,
                                        const std::vector<std::string>& names);

// The model's tensors in gradient-ready order, each with its parameter group's weight decay and lr
// scale: the built-in model's from the catalog (its errors name the `workload` field), or an
// attached model's as workload.attached lists them (names and shapes; a scalar, shape [], has
// one element). `spec` has its defaults applied.
absl::StatusOr<std::vector<sharding::TensorSpec>> TensorsForJob(const v1::JobSpec& spec);

// The plan of `spec` (defaults applied) at `world_size` ranks. A zero3 spec whose
// gather_pool_buckets is below the most buckets one module spans in that plan is refused
// (INVALID_ARGUMENT naming gather_pool_buckets and both numbers).
absl::StatusOr<sharding::ShardPlan> PlanForJob(const v1::JobSpec& spec, int64_t world_size);

// The API view of `plan` for `rank`: counts and hash always, its pieces with fragments, and the
// global layout (tensors and buckets) when `include_layout`.
absl::StatusOr<v1::ShardPlan> PlanToProto(const sharding::ShardPlan& plan, int64_t rank,
                                          bool include_layout);

// zero3's gather pool in bytes for `spec` (defaults applied) on `plan`: the windows its
// gather_pool_buckets hold (unset: sharding::DefaultGatherPoolBuckets), each the largest module's
// span, in the parameter dtype (sharding/gather_windows.h). 0 for other modes.
int64_t GatherPoolBytesForJob(const v1::JobSpec& spec, const sharding::ShardPlan& plan);

// The ZeRO formula's model-state bytes per rank (sharding/zero_formula.h) for `spec`'s mode,
// precision and optimizer at `world_size` ranks and `parameters` (Ψ) parameters: what
// GetShardPlan serves as ShardPlan.model_state_formula. Unset fields count as their defaults
// (DDP, FLOAT32 parameters, gradients in the parameters' dtype). zero3 adds its gather pool,
// `gather_pool_bytes` (GatherPoolBytesForJob), which other modes ignore.
v1::ModelStateFormula ModelStateFormulaForJob(const v1::JobSpec& spec, int64_t world_size,
                                              int64_t parameters, int64_t gather_pool_bytes = 0);

}  // namespace zeroshard::jobspec

#endif  // ZEROSHARD_JOBSPEC_JOB_PLAN_H_
