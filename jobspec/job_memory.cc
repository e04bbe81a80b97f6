// A job spec's per-rank memory need (job_memory.h).
#include "jobspec/job_memory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "jobspec/job_plan.h"
#include "numerics/dtype.h"

namespace zeroshard::jobspec {
namespace {

absl::StatusOr<numerics::DType> EngineDType(absl::string_view field, v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32:
      return numerics::DType::kFloat32;
    case v1::BFLOAT16:
      return numerics::DType::kBFloat16;
    case v1::FLOAT16:
      return numerics::DType::kFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", v1::DType_Name(dtype), " is not held by the engine"));
  }
}

sharding::ZeroStage StageOf(v1::Mode mode) {
  switch (mode) {
    case v1::ZERO1:
      return sharding::ZeroStage::kZero1;
    case v1::ZERO2:
      return sharding::ZeroStage::kZero2;
    case v1::ZERO3:
      return sharding::ZeroStage::kZero3;
    default:
      return sharding::ZeroStage::kDdp;
  }
}

}  // namespace

absl::StatusOr<sharding::RankMemoryOptions> RankMemoryOptionsForJob(const v1::JobSpec& spec,
                                                                    v1::Mode mode,
                                                                    v1::DeviceKind device_kind) {
  sharding::RankMemoryOptions options;
  options.mode = StageOf(mode);
  const v1::PrecisionSpec& precision = spec.precision();
  absl::StatusOr<numerics::DType> param =
      EngineDType("precision.param_dtype", precision.param_dtype());
  if (!param.ok()) return param.status();
  // Unset gradients take the parameters' dtype (jobspec::WithDefaults).
  absl::StatusOr<numerics::DType> grad =
      precision.grad_dtype() == v1::DTYPE_UNSPECIFIED
          ? *param
          : EngineDType("precision.grad_dtype", precision.grad_dtype());
  if (!grad.ok()) return grad.status();
  absl::StatusOr<numerics::DType> reduce =
      EngineDType("precision.reduce_dtype", precision.reduce_dtype());
  if (!reduce.ok()) return reduce.status();
  options.param_dtype = *param;
  options.grad_dtype = *grad;
  options.reduce_dtype = *reduce;
  // The same K the served ZeRO formula uses (torch.optim's state arrays per parameter).
  options.state_arrays_per_param =
      ModelStateFormulaForJob(spec, /*world_size=*/1, /*parameters=*/0).optimizer_state_copies();
  if (mode == v1::ZERO3) options.gather_pool_buckets = spec.gather_pool_buckets();
  options.grad_stats_chunk_elements =
      device_kind == v1::CUDA ? kCudaGradStatsChunkElements : sharding::kCpuGradStatsChunkElements;
  return options;
}

absl::StatusOr<sharding::RankMemoryBytes> JobMemoryNeed(const v1::JobSpec& spec, v1::Mode mode,
                                                        int64_t world_size) {
  absl::StatusOr<sharding::RankMemoryOptions> options =
      RankMemoryOptionsForJob(spec, mode, spec.device_kind());
  if (!options.ok()) return options.status();
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, world_size);
  if (!plan.ok()) return plan.status();
  return sharding::MaxRankMemoryNeed(*plan, *options);
}

}  // namespace zeroshard::jobspec
