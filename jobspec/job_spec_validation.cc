// ValidateJobSpec and ValidateCheckpointPath: the ranges of job.proto's comments, checked in
// field order, plus the workload (through the model catalog, or the attached tensor list) and the
// batch/world-size rule.
#include "jobspec/job_spec_validation.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "jobspec/job_spec_defaults.h"
#include "jobspec/job_spec_validation_checks.h"
#include "sharding/model_catalog.h"
#include "sharding/shard_planner.h"

namespace zeroshard::jobspec {
namespace {

using ::zeroshard::v1::JobSpec;
using ::zeroshard::v1::OptimizerKind;
using ::zeroshard::v1::OptimizerSpec;
using ::zeroshard::v1::PrecisionSpec;

constexpr int64_t kMaxDatasetSize = int64_t{1} << 40;
// torch.optim takes any lr; SGD recipes reach 20 (pytorch/examples' word-language model) and more.
constexpr double kMaxLr = 1000;
constexpr double kMaxWeightDecay = 10;
constexpr double kMaxInitialAccumulator = 1e6;
constexpr double kMaxLossScale = 16777216;  // 2^24
constexpr int64_t kMaxLossScaleGrowthInterval = 1000000;
constexpr double kMaxLossScaleGrowthFactor = 1000;
constexpr int kMaxParamGroups = 64;
constexpr int kMaxGroupPatterns = 64;
constexpr size_t kMaxPatternLength = 256;
constexpr double kMaxLrScale = 1000;
constexpr double kMaxClipGradNorm = 1e6;
constexpr int64_t kMaxSteps = 1000000000;
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 24;
constexpr int64_t kMaxCheckpointEverySteps = 1000000000;
constexpr int64_t kMaxCheckpointKeep = 100;
constexpr int64_t kMaxAttempts = 100;

// A list entry's name must be unique: returns the index of an earlier entry named `name`, or
// records `index` for it and returns -1.
int FirstIndexOf(absl::flat_hash_map<absl::string_view, int>& index_by_name, absl::string_view name,
                 int index) {
  const auto [it, inserted] = index_by_name.emplace(name, index);
  return inserted ? -1 : it->second;
}

absl::Status ValidateAttachedTensors(const v1::AttachedModel& attached) {
  const int count = attached.tensors_size();
  if (count < 1 || count > kMaxAttachedTensors) {
    return absl::InvalidArgumentError(absl::StrCat("workload.attached.tensors: ", count,
                                                   " tensors; 1 to ", kMaxAttachedTensors,
                                                   " are allowed"));
  }
  absl::flat_hash_map<absl::string_view, int> index_by_name;
  index_by_name.reserve(count);
  int64_t total_elements = 0;
  for (int t = 0; t < count; ++t) {
    const v1::AttachedTensor& tensor = attached.tensors(t);
    const std::string field = absl::StrCat("workload.attached.tensors[", t, "]");
    if (tensor.name().empty() || tensor.name().size() > kMaxAttachedTensorNameLength) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: ", Quote(tensor.name()),
                                                     " must be 1 to ", kMaxAttachedTensorNameLength,
                                                     " characters"));
    }
    if (const int first = FirstIndexOf(index_by_name, tensor.name(), t); first >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: ", Quote(tensor.name()),
                                                     " is also the name of tensors[", first,
                                                     "]; names must be unique"));
    }
    int64_t elements = 1;
    for (int d = 0; d < tensor.shape_size(); ++d) {
      const int64_t dim = tensor.shape(d);
      if (dim < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".shape[", d, "]: must be >= 1, got ", dim));
      }
      // Checked before multiplying, so the product never overflows.
      if (elements > kMaxAttachedElements / dim) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".shape: more than ",
                                                       kMaxAttachedElements, " elements; at most ",
                                                       kMaxAttachedElements, " in all"));
      }
      elements *= dim;
    }
    // Each term is at most kMaxAttachedElements and the sum stops at the first excess: no
    // overflow.
    total_elements += elements;
    if (total_elements > kMaxAttachedElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.attached.tensors: more than ", kMaxAttachedElements,
                       " elements in all (the limit is passed at tensors[", t, "])"));
    }
  }
  // Aliases after every name, so that an alias naming a later tensor is refused as such.
  int aliases = 0;
  // The tensor each alias belongs to, for the message when another one repeats it.
  absl::flat_hash_map<absl::string_view, int> tensor_of_alias;
  for (int t = 0; t < count; ++t) {
    const v1::AttachedTensor& tensor = attached.tensors(t);
    aliases += tensor.aliases_size();
    if (aliases > kMaxAttachedAliases) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.attached.tensors: more than ", kMaxAttachedAliases,
                       " aliases in all (the limit is passed at tensors[", t, "])"));
    }
    for (int a = 0; a < tensor.aliases_size(); ++a) {
      const std::string& alias = tensor.aliases(a);
      const std::string field = absl::StrCat("workload.attached.tensors[", t, "].aliases[", a, "]");
      if (alias.empty() || alias.size() > kMaxAttachedTensorNameLength) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quote(alias), " must be 1 to ",
                                                       kMaxAttachedTensorNameLength,
                                                       " characters"));
      }
      if (const auto named = index_by_name.find(alias); named != index_by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quote(alias),
                                                       " is the name of tensors[", named->second,
                                                       "]; names and aliases must be unique"));
      }
      if (const auto [it, inserted] = tensor_of_alias.emplace(alias, t); !inserted) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quote(alias),
                                                       " is also an alias of tensors[", it->second,
                                                       "]; names and aliases must be unique"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAttachedWorkers(const v1::AttachedModel& attached) {
  const int count = attached.workers_size();
  if (count == 0) {
    return absl::InvalidArgumentError(
        "workload.attached.workers: required: the worker of each rank, in rank order");
  }
  if (count > sharding::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("workload.attached.workers: ", count,
                                                   " workers; 1 to ", sharding::kMaxWorldSize,
                                                   " are allowed"));
  }
  absl::flat_hash_map<absl::string_view, int> rank_by_name;
  rank_by_name.reserve(count);
  for (int rank = 0; rank < count; ++rank) {
    const std::string field = absl::StrCat("workload.attached.workers[", rank, "]");
    const std::string& name = attached.workers(rank);
    ZS_RETURN_IF_ERROR(CheckName(field, name));
    if (const int first = FirstIndexOf(rank_by_name, name, rank); first >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quote(name), " is also workers[",
                                                     first,
                                                     "]; each rank needs a worker of its own"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkload(const v1::WorkloadSpec& workload) {
  if (workload.has_attached()) {
    if (!workload.preset().empty() || workload.layer_sizes_size() > 0) {
      return absl::InvalidArgumentError(
          "workload.attached: set either attached or preset/layer_sizes, not both");
    }
    // Attached trainers load their own data: a synthetic dataset size would mean nothing.
    if (workload.has_dataset_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.dataset_size: does not apply to attached models (their "
                       "trainers load the data); leave it unset, got ",
                       workload.dataset_size()));
    }
    ZS_RETURN_IF_ERROR(ValidateAttachedTensors(workload.attached()));
    return ValidateAttachedWorkers(workload.attached());
  }
  // The catalog quotes an unknown preset whole.
  ZS_RETURN_IF_ERROR(CheckMaxBytes("workload.preset", workload.preset(), kMaxPresetBytes));
  sharding::WorkloadSpec catalog_spec;
  catalog_spec.preset = workload.preset();
  catalog_spec.layer_sizes.assign(workload.layer_sizes().begin(), workload.layer_sizes().end());
  // The catalog names the workload fields itself; its errors are all about the request.
  const absl::StatusOr<std::vector<int64_t>> sizes = sharding::ResolveLayerSizes(catalog_spec);
  if (!sizes.ok()) return absl::InvalidArgumentError(sizes.status().message());
  return CheckIntInRange("workload.dataset_size", workload.dataset_size(), 1, kMaxDatasetSize);
}

std::string KindName(OptimizerKind kind) { return v1::OptimizerKind_Name(kind); }

// OK when `kind` is one of `applies_to`, or when the field holds `default_for_kind` (the value
// WithDefaults gives an unset field), which is what "left unset" looks like after defaults.
absl::Status CheckAppliesTo(absl::string_view field, OptimizerKind kind,
                            std::initializer_list<OptimizerKind> applies_to,
                            bool holds_default_for_kind) {
  if (holds_default_for_kind || absl::c_linear_search(applies_to, kind)) return absl::OkStatus();
  std::vector<std::string> names;
  for (OptimizerKind k : applies_to) names.push_back(KindName(k));
  const std::string last = names.back();
  names.pop_back();
  const std::string kinds =
      names.empty() ? last : absl::StrCat(absl::StrJoin(names, ", "), " and ", last);
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": only applies to ", kinds, "; leave it unset for ", KindName(kind)));
}

absl::Status ValidateOptimizer(const OptimizerSpec& opt) {
  ZS_RETURN_IF_ERROR(CheckEnumIn("optimizer.kind", *v1::OptimizerKind_descriptor(), opt.kind(),
                                 {v1::SGD, v1::ADAM, v1::ADAMW, v1::ADAGRAD, v1::LION}));
  const OptimizerKind kind = opt.kind();
  JobSpec only_kind;
  only_kind.mutable_optimizer()->set_kind(kind);
  const OptimizerSpec defaults = WithDefaults(only_kind).optimizer();
  constexpr OptimizerKind kSgd = v1::SGD, kAdam = v1::ADAM, kAdamW = v1::ADAMW,
                          kAdagrad = v1::ADAGRAD, kLion = v1::LION;

  ZS_RETURN_IF_ERROR(
      CheckDoubleInRange("optimizer.lr", opt.lr(), 0, Bound::kOpen, kMaxLr, Bound::kClosed));

  ZS_RETURN_IF_ERROR(
      CheckDoubleInRange("optimizer.beta1", opt.beta1(), 0, Bound::kClosed, 1, Bound::kOpen));
  ZS_RETURN_IF_ERROR(CheckAppliesTo("optimizer.beta1", kind, {kAdam, kAdamW, kLion},
                                    opt.beta1() == defaults.beta1()));

  ZS_RETURN_IF_ERROR(
      CheckDoubleInRange("optimizer.beta2", opt.beta2(), 0, Bound::kClosed, 1, Bound::kOpen));
  ZS_RETURN_IF_ERROR(CheckAppliesTo("optimizer.beta2", kind, {kAdam, kAdamW, kLion},
                                    opt.beta2() == defaults.beta2()));

  ZS_RETURN_IF_ERROR(
      CheckDoubleInRange("optimizer.eps", opt.eps(), 0, Bound::kClosed, 1, Bound::kClosed));
  ZS_RETURN_IF_ERROR(CheckAppliesTo("optimizer.eps", kind, {kAdam, kAdamW, kAdagrad},
                                    opt.eps() == defaults.eps()));

  ZS_RETURN_IF_ERROR(CheckDoubleInRange("optimizer.weight_decay", opt.weight_decay(), 0,
                                        Bound::kClosed, kMaxWeightDecay, Bound::kClosed));

  ZS_RETURN_IF_ERROR(
      CheckDoubleInRange("optimizer.momentum", opt.momentum(), 0, Bound::kClosed, 1, Bound::kOpen));
  ZS_RETURN_IF_ERROR(
      CheckAppliesTo("optimizer.momentum", kind, {kSgd}, opt.momentum() == defaults.momentum()));

  ZS_RETURN_IF_ERROR(CheckDoubleInRange("optimizer.dampening", opt.dampening(), 0, Bound::kClosed,
                                        1, Bound::kClosed));
  ZS_RETURN_IF_ERROR(
      CheckAppliesTo("optimizer.dampening", kind, {kSgd}, opt.dampening() == defaults.dampening()));

  ZS_RETURN_IF_ERROR(
      CheckAppliesTo("optimizer.nesterov", kind, {kSgd}, opt.nesterov() == defaults.nesterov()));
  if (opt.nesterov() && (opt.momentum() <= 0 || opt.dampening() != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.nesterov: needs momentum > 0 and dampening 0, got momentum ",
                     jobspec::FormatDouble(opt.momentum()), " and dampening ",
                     jobspec::FormatDouble(opt.dampening())));
  }

  ZS_RETURN_IF_ERROR(CheckAppliesTo("optimizer.amsgrad", kind, {kAdam, kAdamW},
                                    opt.amsgrad() == defaults.amsgrad()));

  ZS_RETURN_IF_ERROR(CheckDoubleInRange("optimizer.lr_decay", opt.lr_decay(), 0, Bound::kClosed, 1,
                                        Bound::kClosed));
  ZS_RETURN_IF_ERROR(CheckAppliesTo("optimizer.lr_decay", kind, {kAdagrad},
                                    opt.lr_decay() == defaults.lr_decay()));

  ZS_RETURN_IF_ERROR(CheckDoubleInRange("optimizer.initial_accumulator_value",
                                        opt.initial_accumulator_value(), 0, Bound::kClosed,
                                        kMaxInitialAccumulator, Bound::kClosed));
  ZS_RETURN_IF_ERROR(
      CheckAppliesTo("optimizer.initial_accumulator_value", kind, {kAdagrad},
                     opt.initial_accumulator_value() == defaults.initial_accumulator_value()));
  return absl::OkStatus();
}

absl::Status ValidateMode(v1::Mode mode) {
  return CheckEnumIn("mode", *v1::Mode_descriptor(), mode,
                     {v1::DDP, v1::ZERO1, v1::ZERO2, v1::ZERO3});
}

// resume_from's form; the coordinator resolves the job and its checkpoint (JobManager::SubmitJob).
absl::Status ValidateResumeFrom(const JobSpec& spec) {
  if (!spec.has_resume_from()) return absl::OkStatus();
  if (spec.workload().has_attached()) {
    return absl::InvalidArgumentError(
        "resume_from: not for attached models; their trainers load a checkpoint themselves "
        "(ShardedOptimizer.load_state_dict)");
  }
  const v1::ResumeFrom& from = spec.resume_from();
  if (from.job_id().empty()) return absl::InvalidArgumentError("resume_from.job_id: required");
  ZS_RETURN_IF_ERROR(jobspec::CheckName("resume_from.job_id", from.job_id()));
  if (from.has_step()) {
    ZS_RETURN_IF_ERROR(CheckIntInRange("resume_from.step", from.step(), 1, kMaxSteps));
  }
  return absl::OkStatus();
}

// gather_pool_buckets sizes zero3's gather pool; no other mode has one. Its lower bound, the most
// buckets one module spans, needs the plan: PlanForJob checks it.
absl::Status ValidateGatherPoolBuckets(const JobSpec& spec) {
  if (!spec.has_gather_pool_buckets()) return absl::OkStatus();
  if (spec.mode() != v1::ZERO3) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather_pool_buckets: only applies to mode ZERO3; leave it unset for ",
                     v1::Mode_Name(spec.mode())));
  }
  return CheckIntInRange("gather_pool_buckets", spec.gather_pool_buckets(), 1,
                         kMaxGatherPoolBuckets);
}

absl::Status ValidatePrecision(const PrecisionSpec& precision, bool attached) {
  const v1::DType kCopyDtypes[] = {v1::FLOAT32, v1::BFLOAT16, v1::FLOAT16};
  const std::vector<int> copy_dtypes(std::begin(kCopyDtypes), std::end(kCopyDtypes));
  const google::protobuf::EnumDescriptor& dtype = *v1::DType_descriptor();
  ZS_RETURN_IF_ERROR(
      CheckEnumIn("precision.param_dtype", dtype, precision.param_dtype(), copy_dtypes));
  // The parameters are the trainer's own tensors, shared with the worker: torch's fp32.
  if (attached && precision.param_dtype() != v1::FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("precision.param_dtype: only FLOAT32 is supported for attached models, got ",
                     v1::DType_Name(precision.param_dtype())));
  }
  ZS_RETURN_IF_ERROR(
      CheckEnumIn("precision.grad_dtype", dtype, precision.grad_dtype(), copy_dtypes));
  ZS_RETURN_IF_ERROR(
      CheckEnumIn("precision.master_dtype", dtype, precision.master_dtype(), {v1::FLOAT32}));
  ZS_RETURN_IF_ERROR(
      CheckEnumIn("precision.reduce_dtype", dtype, precision.reduce_dtype(), copy_dtypes));
  ZS_RETURN_IF_ERROR(CheckDoubleInRange("precision.initial_loss_scale",
                                        precision.initial_loss_scale(), 1, Bound::kClosed,
                                        kMaxLossScale, Bound::kClosed));
  ZS_RETURN_IF_ERROR(CheckIntInRange("precision.loss_scale_growth_interval",
                                     precision.loss_scale_growth_interval(), 1,
                                     kMaxLossScaleGrowthInterval));
  ZS_RETURN_IF_ERROR(CheckDoubleInRange("precision.loss_scale_backoff_factor",
                                        precision.loss_scale_backoff_factor(), 0, Bound::kOpen, 1,
                                        Bound::kOpen));
  return CheckDoubleInRange("precision.loss_scale_growth_factor",
                            precision.loss_scale_growth_factor(), 1, Bound::kOpen,
                            kMaxLossScaleGrowthFactor, Bound::kClosed);
}

absl::Status ValidateParamGroups(const JobSpec& spec) {
  // Groups listing tensors by index cost one entry per tensor: as many as the model has tensors.
  // Pattern groups are matched against every name: at most kMaxParamGroups of them.
  const bool attached = spec.workload().has_attached();
  const int num_tensors = attached ? spec.workload().attached().tensors_size() : 0;
  const int max_groups = attached ? std::max(kMaxParamGroups, num_tensors) : kMaxParamGroups;
  if (spec.param_groups_size() > max_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("param_groups: ", spec.param_groups_size(), " groups; at most ", max_groups));
  }
  int pattern_groups = 0;
  // The group listing each tensor, to refuse a tensor listed twice.
  std::vector<int> listed_by(static_cast<size_t>(num_tensors), -1);
  for (int g = 0; g < spec.param_groups_size(); ++g) {
    const v1::ParamGroup& group = spec.param_groups(g);
    const std::string field = absl::StrCat("param_groups[", g, "]");
    if (group.tensors_size() > 0) {
      if (!attached) {
        return absl::InvalidArgumentError(
            absl::StrCat(field,
                         ".tensors: only attached models list tensors by index; use "
                         "patterns"));
      }
      if (group.patterns_size() > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": has both patterns and tensors; set one"));
      }
      for (int i = 0; i < group.tensors_size(); ++i) {
        const int32_t t = group.tensors(i);
        if (t < 0 || t >= num_tensors) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".tensors[", i, "]: ", t, " is not a tensor index in [0, ", num_tensors, ")"));
        }
        if (listed_by[t] >= 0) {
          return absl::InvalidArgumentError(absl::StrCat(field, ".tensors[", i, "]: tensor ", t,
                                                         " is already in param_groups[",
                                                         listed_by[t], "]"));
        }
        listed_by[t] = g;
      }
    } else {
      if (++pattern_groups > kMaxParamGroups) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".patterns: more than ", kMaxParamGroups,
            " groups with patterns (list an attached model's tensors by index instead)"));
      }
      if (group.patterns_size() < 1 || group.patterns_size() > kMaxGroupPatterns) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".patterns: ", group.patterns_size(),
                                                       " patterns; 1 to ", kMaxGroupPatterns,
                                                       " are allowed"));
      }
    }
    for (int p = 0; p < group.patterns_size(); ++p) {
      const std::string& pattern = group.patterns(p);
      if (pattern.empty() || pattern.size() > kMaxPatternLength) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".patterns[", p, "]: ", jobspec::Quote(pattern), " must be 1 to ",
                         kMaxPatternLength, " characters"));
      }
    }
    if (group.has_weight_decay()) {
      ZS_RETURN_IF_ERROR(CheckDoubleInRange(absl::StrCat(field, ".weight_decay"),
                                            group.weight_decay(), 0, Bound::kClosed,
                                            kMaxWeightDecay, Bound::kClosed));
    }
    if (group.has_lr_scale()) {
      ZS_RETURN_IF_ERROR(CheckDoubleInRange(absl::StrCat(field, ".lr_scale"), group.lr_scale(), 0,
                                            Bound::kClosed, kMaxLrScale, Bound::kClosed));
    }
  }
  return absl::OkStatus();
}

// docs/design.md, "Batch": the scheduler picks a world size W in [min_workers, max_workers] that
// divides the global batch, so at least one must exist.
absl::Status CheckSomeWorldSizeDividesBatch(const JobSpec& spec) {
  for (int64_t w = spec.min_workers(); w <= spec.max_workers(); ++w) {
    if (spec.global_batch() % w == 0) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "global_batch: ", spec.global_batch(), " has no divisor in [min_workers, max_workers] = [",
      spec.min_workers(), ", ", spec.max_workers(), "]; the world size must divide it"));
}

// An attached job runs exactly on its pinned workers, one rank each.
absl::Status CheckPinnedWorkerCount(absl::string_view field, int64_t value, int pinned) {
  if (value == pinned) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", value, " must equal the number of workload.attached.workers (", pinned, ")"));
}

// Attached jobs run until their trainers finish, on data their trainers load.
absl::Status CheckAttachedStepsAndBatch(const JobSpec& spec) {
  if (spec.steps() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps: attached jobs have no fixed step count (they end when their "
                     "trainers finish); leave it unset or 0, got ",
                     spec.steps()));
  }
  if (spec.has_global_batch()) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch: does not apply to attached jobs (their trainers load the "
                     "data); leave it unset, got ",
                     spec.global_batch()));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpointPolicy(const v1::CheckpointPolicy& checkpoint) {
  ZS_RETURN_IF_ERROR(CheckIntInRange("checkpoint.every_steps", checkpoint.every_steps(), 0,
                                     kMaxCheckpointEverySteps));
  if (!checkpoint.dir().empty()) {
    ZS_RETURN_IF_ERROR(ValidateCheckpointPath(checkpoint.dir(), "checkpoint.dir"));
  }
  return CheckIntInRange("checkpoint.keep", checkpoint.keep(), 1, kMaxCheckpointKeep);
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  const bool attached = spec.workload().has_attached();
  const int pinned = spec.workload().attached().workers_size();
  ZS_RETURN_IF_ERROR(jobspec::CheckName("name", spec.name()));
  if (!spec.run_key().empty()) ZS_RETURN_IF_ERROR(jobspec::CheckName("run_key", spec.run_key()));
  ZS_RETURN_IF_ERROR(ValidateWorkload(spec.workload()));
  ZS_RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  ZS_RETURN_IF_ERROR(ValidateMode(spec.mode()));
  ZS_RETURN_IF_ERROR(ValidatePrecision(spec.precision(), attached));
  ZS_RETURN_IF_ERROR(ValidateParamGroups(spec));
  ZS_RETURN_IF_ERROR(CheckDoubleInRange("clip_grad_norm", spec.clip_grad_norm(), 0, Bound::kClosed,
                                        kMaxClipGradNorm, Bound::kClosed));
  ZS_RETURN_IF_ERROR(CheckIntInRange("bucket_elems", spec.bucket_elems(), sharding::kMinBucketElems,
                                     sharding::kMaxBucketElems));
  ZS_RETURN_IF_ERROR(
      CheckIntInRange("min_workers", spec.min_workers(), 1, sharding::kMaxWorldSize));
  if (attached)
    ZS_RETURN_IF_ERROR(CheckPinnedWorkerCount("min_workers", spec.min_workers(), pinned));
  if (spec.max_workers() < spec.min_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("max_workers: ", spec.max_workers(),
                                                   " is below min_workers ", spec.min_workers()));
  }
  if (spec.max_workers() > sharding::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("max_workers: ", spec.max_workers(),
                                                   " is out of range [min_workers, ",
                                                   sharding::kMaxWorldSize, "]"));
  }
  if (attached)
    ZS_RETURN_IF_ERROR(CheckPinnedWorkerCount("max_workers", spec.max_workers(), pinned));
  ZS_RETURN_IF_ERROR(CheckEnumIn("device_kind", *v1::DeviceKind_descriptor(), spec.device_kind(),
                                 {v1::CPU, v1::CUDA}));
  if (attached) {
    ZS_RETURN_IF_ERROR(CheckAttachedStepsAndBatch(spec));
  } else {
    ZS_RETURN_IF_ERROR(CheckIntInRange("steps", spec.steps(), 1, kMaxSteps));
    ZS_RETURN_IF_ERROR(CheckIntInRange("global_batch", spec.global_batch(), 1, kMaxGlobalBatch));
    ZS_RETURN_IF_ERROR(CheckSomeWorldSizeDividesBatch(spec));
  }
  ZS_RETURN_IF_ERROR(ValidateCheckpointPolicy(spec.checkpoint()));
  ZS_RETURN_IF_ERROR(CheckIntInRange("max_attempts", spec.max_attempts(), 1, kMaxAttempts));
  ZS_RETURN_IF_ERROR(ValidateResumeFrom(spec));
  return ValidateGatherPoolBuckets(spec);
}

absl::Status ValidateCheckpointPath(absl::string_view path, absl::string_view field_path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field_path, ": required"));
  ZS_RETURN_IF_ERROR(jobspec::CheckMaxBytes(field_path, path, kMaxCheckpointPathBytes));
  for (char c : path) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_path, ": ", Quote(path), " contains a control character"));
    }
  }
  if (path.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(field_path, ": ", Quote(path),
                     " is absolute; it must be relative and must not contain \"..\""));
  }
  for (absl::string_view component : absl::StrSplit(path, '/')) {
    if (component == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(field_path, ": ", Quote(path),
                       " has a \"..\" component; it must be relative and must not contain \"..\""));
    }
    if (component.empty() || component == ".") {
      return absl::InvalidArgumentError(
          absl::StrCat(field_path, ": ", Quote(path),
                       " has an empty or \".\" component (\"//\", \"/./\" or a trailing \"/\")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::jobspec
