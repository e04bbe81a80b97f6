// EngineConfigForJob: a JobSpec's fields onto the engine's configuration.
#include "worker/daemon/engine_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "jobspec/job_plan.h"
#include "kernels/optimizer.h"
#include "numerics/dtype.h"

namespace zeroshard::worker {
namespace {

// The spec arrives with defaults applied (DTYPE_UNSPECIFIED is FLOAT32); FLOAT64 is refused
// rather than silently trained in fp32.
absl::StatusOr<numerics::DType> ToKernelDType(absl::string_view field, v1::DType dtype) {
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
          absl::StrCat(field, ": ", v1::DType_Name(dtype), " is not supported by this worker"));
  }
}

}  // namespace

absl::StatusOr<engine::EngineConfig> EngineConfigForJob(const v1::JobSpec& spec, int threads) {
  engine::EngineConfig config;
  switch (spec.mode()) {
    case v1::DDP:
      config.mode = engine::EngineMode::kDdp;
      break;
    case v1::ZERO1:
      config.mode = engine::EngineMode::kZero1;
      break;
    case v1::ZERO2:
      config.mode = engine::EngineMode::kZero2;
      break;
    case v1::ZERO3:
      config.mode = engine::EngineMode::kZero3;
      // Unset stays 0, the engine's default pool (twice the most buckets one module spans).
      config.gather_pool_buckets = spec.gather_pool_buckets();
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode: ", v1::Mode_Name(spec.mode()), " is not supported by this worker"));
  }
  const v1::OptimizerSpec& opt = spec.optimizer();
  kernels::OptimizerConfig& out = config.optimizer;
  switch (opt.kind()) {
    case v1::SGD:
      out.kind = kernels::OptimizerKind::kSgd;
      break;
    case v1::ADAM:
      out.kind = kernels::OptimizerKind::kAdam;
      break;
    case v1::ADAMW:
      out.kind = kernels::OptimizerKind::kAdamW;
      break;
    case v1::ADAGRAD:
      out.kind = kernels::OptimizerKind::kAdagrad;
      break;
    case v1::LION:
      out.kind = kernels::OptimizerKind::kLion;
      break;
    default:
      return absl::InvalidArgumentError("optimizer.kind: unsupported");
  }
  out.lr = opt.lr();
  out.beta1 = opt.beta1();
  out.beta2 = opt.beta2();
  out.eps = opt.eps();
  out.momentum = opt.momentum();
  out.dampening = opt.dampening();
  out.nesterov = opt.nesterov();
  out.amsgrad = opt.amsgrad();
  out.maximize = opt.maximize();
  out.lr_decay = opt.lr_decay();
  out.initial_accumulator_value = opt.initial_accumulator_value();
  const v1::PrecisionSpec& precision = spec.precision();
  ZS_ASSIGN_OR_RETURN(config.param_dtype,
                      ToKernelDType("precision.param_dtype", precision.param_dtype()));
  ZS_ASSIGN_OR_RETURN(config.grad_dtype,
                      ToKernelDType("precision.grad_dtype", precision.grad_dtype()));
  ZS_ASSIGN_OR_RETURN(config.reduce_dtype,
                      ToKernelDType("precision.reduce_dtype", precision.reduce_dtype()));
  if (precision.master_dtype() != v1::DTYPE_UNSPECIFIED &&
      precision.master_dtype() != v1::FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("precision.master_dtype: ", v1::DType_Name(precision.master_dtype()),
                     " is not supported (master weights are fp32)"));
  }
  config.loss_scale.initial_scale = precision.initial_loss_scale();
  config.loss_scale.dynamic = precision.dynamic_loss_scale();
  config.loss_scale.growth_interval = precision.loss_scale_growth_interval();
  config.loss_scale.backoff_factor = precision.loss_scale_backoff_factor();
  config.loss_scale.growth_factor = precision.loss_scale_growth_factor();
  config.clip_grad_norm = spec.clip_grad_norm();
  config.threads = threads;
  return config;
}

std::vector<int32_t> TensorGroupsForPlan(const v1::JobSpec& spec, const sharding::ShardPlan& plan) {
  std::vector<std::string> names;
  names.reserve(plan.num_tensors());
  for (const sharding::TensorSpec& tensor : plan.tensors()) names.push_back(tensor.name);
  std::vector<int32_t> groups;
  groups.reserve(names.size());
  for (const int group : jobspec::GroupIndexOfEachTensor(spec, names)) groups.push_back(group + 1);
  return groups;
}

}  // namespace zeroshard::worker
