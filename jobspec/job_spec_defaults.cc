// JobSpec defaults (see job.proto for each field's documented default).
#include "jobspec/job_spec_defaults.h"

#include <algorithm>
#include <string>

namespace zeroshard::jobspec {

using ::zeroshard::v1::JobSpec;
using ::zeroshard::v1::OptimizerKind;
using ::zeroshard::v1::OptimizerSpec;
using ::zeroshard::v1::PrecisionSpec;

namespace {

void ApplyOptimizerDefaults(OptimizerSpec& opt) {
  const OptimizerKind kind = opt.kind();
  if (!opt.has_lr()) opt.set_lr(0.001);
  if (!opt.has_beta1()) opt.set_beta1(0.9);
  if (!opt.has_beta2()) opt.set_beta2(kind == v1::LION ? 0.99 : 0.999);
  if (!opt.has_eps()) opt.set_eps(kind == v1::ADAGRAD ? 1e-10 : 1e-8);
  if (!opt.has_weight_decay()) opt.set_weight_decay(kind == v1::ADAMW ? 0.01 : 0.0);
  if (!opt.has_momentum()) opt.set_momentum(0.0);
  if (!opt.has_dampening()) opt.set_dampening(0.0);
  if (!opt.has_nesterov()) opt.set_nesterov(false);
  if (!opt.has_amsgrad()) opt.set_amsgrad(false);
  if (!opt.has_maximize()) opt.set_maximize(false);
  if (!opt.has_lr_decay()) opt.set_lr_decay(0.0);
  if (!opt.has_initial_accumulator_value()) opt.set_initial_accumulator_value(0.0);
}

void ApplyPrecisionDefaults(PrecisionSpec& precision) {
  if (precision.param_dtype() == v1::DTYPE_UNSPECIFIED) precision.set_param_dtype(v1::FLOAT32);
  if (precision.grad_dtype() == v1::DTYPE_UNSPECIFIED) {
    precision.set_grad_dtype(precision.param_dtype());
  }
  if (precision.master_dtype() == v1::DTYPE_UNSPECIFIED) precision.set_master_dtype(v1::FLOAT32);
  if (precision.reduce_dtype() == v1::DTYPE_UNSPECIFIED) precision.set_reduce_dtype(v1::FLOAT32);
  const bool fp16 = precision.grad_dtype() == v1::FLOAT16;
  if (!precision.has_initial_loss_scale()) {
    precision.set_initial_loss_scale(fp16 ? kDefaultFp16LossScale : 1.0);
  }
  if (!precision.has_dynamic_loss_scale()) precision.set_dynamic_loss_scale(fp16);
  if (!precision.has_loss_scale_growth_interval()) {
    precision.set_loss_scale_growth_interval(kDefaultLossScaleGrowthInterval);
  }
  if (!precision.has_loss_scale_backoff_factor()) {
    precision.set_loss_scale_backoff_factor(kDefaultLossScaleBackoffFactor);
  }
  if (!precision.has_loss_scale_growth_factor()) {
    precision.set_loss_scale_growth_factor(kDefaultLossScaleGrowthFactor);
  }
}

}  // namespace

int64_t DefaultBucketElems(const JobSpec& spec) {
  if (!spec.workload().has_attached() || spec.mode() != v1::ZERO3) {
    return sharding::kDefaultBucketElems;
  }
  int64_t elements = 0;
  for (const v1::AttachedTensor& tensor : spec.workload().attached().tensors()) {
    int64_t count = 1;
    for (const int64_t dimension : tensor.shape()) count *= dimension;
    elements += count;
  }
  const int64_t per_bucket =
      (elements + kAttachedZero3BucketsPerModel - 1) / kAttachedZero3BucketsPerModel;
  return std::clamp(per_bucket, kAttachedZero3MinBucketElems, sharding::kDefaultBucketElems);
}

JobSpec WithDefaults(JobSpec spec, const std::string& job_id) {
  // Attached trainers load their own data and decide when to stop, so an attached job gets no
  // dataset size, no global batch and no step count (0: none), and runs on its pinned workers.
  const bool attached = spec.workload().has_attached();
  const int32_t pinned_workers = spec.workload().attached().workers_size();
  if (!attached && !spec.workload().has_dataset_size()) {
    spec.mutable_workload()->set_dataset_size(kDefaultDatasetSize);
  }
  ApplyOptimizerDefaults(*spec.mutable_optimizer());
  if (spec.mode() == v1::MODE_UNSPECIFIED) spec.set_mode(v1::ZERO2);
  ApplyPrecisionDefaults(*spec.mutable_precision());
  if (!spec.has_clip_grad_norm()) spec.set_clip_grad_norm(0.0);
  if (!spec.has_bucket_elems()) spec.set_bucket_elems(DefaultBucketElems(spec));
  if (!spec.has_min_workers()) spec.set_min_workers(attached ? pinned_workers : 1);
  if (!spec.has_max_workers()) {
    spec.set_max_workers(attached ? pinned_workers : spec.min_workers());
  }
  if (spec.device_kind() == v1::DEVICE_KIND_UNSPECIFIED) spec.set_device_kind(v1::CPU);
  if (!spec.has_steps()) spec.set_steps(attached ? 0 : kDefaultSteps);
  if (!attached && !spec.has_global_batch()) spec.set_global_batch(kDefaultGlobalBatch);
  if (!spec.has_seed()) spec.set_seed(0);
  v1::CheckpointPolicy& checkpoint = *spec.mutable_checkpoint();
  if (!checkpoint.has_every_steps()) checkpoint.set_every_steps(0);
  if (checkpoint.dir().empty()) checkpoint.set_dir(job_id);
  if (!checkpoint.has_keep()) checkpoint.set_keep(kDefaultCheckpointKeep);
  if (!spec.has_max_attempts()) spec.set_max_attempts(kDefaultMaxAttempts);
  return spec;
}

}  // namespace zeroshard::jobspec
