// Job spec -> tensors -> shard plan -> v1::ShardPlan.
#include "jobspec/job_plan.h"

#include <fnmatch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/gather_windows.h"
#include "sharding/model_catalog.h"
#include "sharding/zero_formula.h"

namespace zeroshard::jobspec {

std::vector<int> GroupIndexOfEachTensor(const v1::JobSpec& spec,
                                        const std::vector<std::string>& names) {
  const int num_tensors = static_cast<int>(names.size());
  // The first group listing each tensor by index (validated specs list each at most once).
  std::vector<int> listed(names.size(), -1);
  for (int g = spec.param_groups_size() - 1; g >= 0; --g) {
    for (const int32_t t : spec.param_groups(g).tensors()) {
      if (t >= 0 && t < num_tensors) listed[t] = g;
    }
  }
  auto matches = [&](const v1::ParamGroup& group, const std::string& name) {
    return std::any_of(
        group.patterns().begin(), group.patterns().end(),
        [&](const std::string& pattern) { return fnmatch(pattern.c_str(), name.c_str(), 0) == 0; });
  };
  std::vector<int> groups(names.size(), -1);
  for (int t = 0; t < num_tensors; ++t) {
    // Groups before the one listing the tensor may still claim it by a pattern.
    const int last = listed[t] >= 0 ? listed[t] : spec.param_groups_size();
    for (int g = 0; g < last && groups[t] < 0; ++g) {
      if (matches(spec.param_groups(g), names[t])) groups[t] = g;
    }
    if (groups[t] < 0) groups[t] = listed[t];
  }
  return groups;
}

namespace {

// The attached trainer's tensors as the spec lists them (validated specs only reach here; the
// planner checks shapes again, so this only guards the element count against overflow).
absl::StatusOr<std::vector<sharding::TensorSpec>> AttachedTensors(
    const v1::AttachedModel& attached) {
  std::vector<sharding::TensorSpec> tensors;
  tensors.reserve(attached.tensors_size());
  for (int t = 0; t < attached.tensors_size(); ++t) {
    const v1::AttachedTensor& tensor = attached.tensors(t);
    sharding::TensorSpec spec;
    spec.name = tensor.name();
    spec.shape.assign(tensor.shape().begin(), tensor.shape().end());
    spec.num_elements = 1;  // a scalar (shape []) has one element
    for (int64_t dim : spec.shape) {
      if (dim < 1 || spec.num_elements > sharding::kMaxFlatElems / dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("workload.attached.tensors[", t,
                         "].shape: not a plannable shape (every dimension "
                         "must be >= 1, the product at most ",
                         sharding::kMaxFlatElems, ")"));
      }
      spec.num_elements *= dim;
    }
    tensors.push_back(std::move(spec));
  }
  return tensors;
}

absl::StatusOr<std::vector<sharding::TensorSpec>> ModelTensors(const v1::WorkloadSpec& spec) {
  if (spec.has_attached()) return AttachedTensors(spec.attached());
  sharding::WorkloadSpec workload;
  workload.preset = spec.preset();
  workload.layer_sizes.assign(spec.layer_sizes().begin(), spec.layer_sizes().end());
  return sharding::BuildTensorList(workload);
}

}  // namespace

absl::StatusOr<std::vector<sharding::TensorSpec>> TensorsForJob(const v1::JobSpec& spec) {
  ZS_ASSIGN_OR_RETURN(std::vector<sharding::TensorSpec> tensors, ModelTensors(spec.workload()));
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const sharding::TensorSpec& tensor : tensors) names.push_back(tensor.name);
  const std::vector<int> groups = GroupIndexOfEachTensor(spec, names);
  for (size_t t = 0; t < tensors.size(); ++t) {
    sharding::TensorSpec& tensor = tensors[t];
    tensor.weight_decay = spec.optimizer().weight_decay();
    tensor.lr_scale = 1.0f;
    if (groups[t] < 0) continue;
    const v1::ParamGroup& group = spec.param_groups(groups[t]);
    if (group.has_weight_decay()) tensor.weight_decay = group.weight_decay();
    if (group.has_lr_scale()) tensor.lr_scale = static_cast<float>(group.lr_scale());
  }
  return tensors;
}

absl::StatusOr<sharding::ShardPlan> PlanForJob(const v1::JobSpec& spec, int64_t world_size) {
  ZS_ASSIGN_OR_RETURN(std::vector<sharding::TensorSpec> tensors, TensorsForJob(spec));
  sharding::ShardPlanOptions options;
  options.bucket_elems = spec.bucket_elems();
  ZS_ASSIGN_OR_RETURN(sharding::ShardPlan plan,
                      sharding::ShardPlan::Create(std::move(tensors), world_size, options));
  // A pool must hold at least one module's buckets at once, or that module could never be
  // gathered whole. Validation cannot say so: the span needs the plan.
  if (spec.mode() == v1::ZERO3 && spec.has_gather_pool_buckets()) {
    const int64_t most = sharding::GatherWindowsFor(plan).max_span_buckets;
    if (spec.gather_pool_buckets() < most) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gather_pool_buckets: ", spec.gather_pool_buckets(),
          " is below the most buckets one module spans (", most, " at bucket_elems ",
          plan.bucket_elems(), " and W = ", world_size,
          "); a module's buckets must fit the pool at once (unset: twice that, ", 2 * most, ")"));
    }
  }
  return plan;
}

absl::StatusOr<v1::ShardPlan> PlanToProto(const sharding::ShardPlan& plan, int64_t rank,
                                          bool include_layout) {
  ZS_ASSIGN_OR_RETURN(sharding::RankView view, plan.ViewForRank(rank));
  v1::ShardPlan out;
  out.set_world_size(static_cast<int32_t>(plan.world_size()));
  out.set_bucket_elems(plan.bucket_elems());
  out.set_layout_hash(plan.layout_hash());
  out.set_total_elems(plan.padded_elems());
  out.set_model_elems(plan.tensor_elems());
  out.set_tensor_count(static_cast<int32_t>(plan.num_tensors()));
  out.set_bucket_count(static_cast<int32_t>(plan.num_buckets()));
  out.set_rank(static_cast<int32_t>(rank));
  out.set_plan_version(kShardPlanVersion);
  if (include_layout) {
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      const sharding::TensorSpec& spec = plan.tensors()[t];
      const sharding::TensorPlacement& placement = plan.placement(t);
      v1::PlanTensor* tensor = out.add_tensors();
      tensor->set_name(spec.name);
      for (int64_t dim : spec.shape) tensor->add_shape(dim);
      tensor->set_flat_offset(placement.flat_offset);
      tensor->set_elements(placement.num_elements);
      tensor->set_weight_decay(spec.weight_decay);
      tensor->set_lr_scale(spec.lr_scale);
      tensor->set_first_bucket(static_cast<int32_t>(placement.first_bucket));
      tensor->set_bucket_count(static_cast<int32_t>(placement.num_buckets));
    }
    for (int64_t b = 0; b < plan.num_buckets(); ++b) {
      const sharding::BucketLayout& layout = plan.buckets()[b];
      v1::PlanBucket* bucket = out.add_buckets();
      bucket->set_index(static_cast<int32_t>(b));
      bucket->set_flat_begin(layout.flat_begin);
      bucket->set_padded_elems(layout.padded_elems);
      bucket->set_piece_elems(layout.piece_elems);
      bucket->set_first_tensor(static_cast<int32_t>(layout.first_tensor));
      bucket->set_tensor_count(static_cast<int32_t>(layout.num_tensors));
      bucket->set_tensor_elems(layout.tensor_elems);
    }
  }
  for (const sharding::OwnedPiece& owned : view.pieces()) {
    v1::PlanPiece* piece = out.add_pieces();
    piece->set_bucket(static_cast<int32_t>(owned.bucket));
    piece->set_flat_begin(owned.flat_begin);
    piece->set_flat_end(owned.flat_end);
    for (const sharding::TensorFragment& fragment : view.FragmentsOf(owned)) {
      v1::PlanFragment* out_fragment = piece->add_fragments();
      out_fragment->set_tensor(static_cast<int32_t>(fragment.tensor));
      out_fragment->set_begin(fragment.tensor_begin);
      out_fragment->set_end(fragment.tensor_end);
      out_fragment->set_flat_offset(fragment.flat_begin);
    }
  }
  return out;
}

namespace {

int DTypeBytes(v1::DType dtype, int unset) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      return 2;
    case v1::FLOAT64:
      return 8;
    default:
      return unset;
  }
}

// K: the fp32 state arrays torch.optim keeps per parameter.
int OptimizerStateCopies(const v1::OptimizerSpec& optimizer) {
  switch (optimizer.kind()) {
    case v1::ADAM:
    case v1::ADAMW:
      return optimizer.amsgrad() ? 3 : 2;
    case v1::SGD:
      return optimizer.momentum() > 0 ? 1 : 0;
    case v1::ADAGRAD:
    case v1::LION:
      return 1;
    default:
      return 0;
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

int64_t GatherPoolBytesForJob(const v1::JobSpec& spec, const sharding::ShardPlan& plan) {
  if (spec.mode() != v1::ZERO3) return 0;
  const sharding::GatherWindows windows = sharding::GatherWindowsFor(plan);
  const int64_t buckets = spec.has_gather_pool_buckets() ? spec.gather_pool_buckets()
                                                         : sharding::DefaultGatherPoolBuckets(plan);
  return sharding::GatherPoolWindows(windows, buckets) * windows.window_elems *
         DTypeBytes(spec.precision().param_dtype(), 4);
}

v1::ModelStateFormula ModelStateFormulaForJob(const v1::JobSpec& spec, int64_t world_size,
                                              int64_t parameters, int64_t gather_pool_bytes) {
  sharding::ZeroFormulaInputs inputs;
  inputs.stage = StageOf(spec.mode());
  inputs.world_size = world_size;
  inputs.parameters = parameters;
  inputs.param_bytes = DTypeBytes(spec.precision().param_dtype(), 4);
  inputs.grad_bytes = DTypeBytes(spec.precision().grad_dtype(), inputs.param_bytes);
  inputs.optimizer_state_copies = OptimizerStateCopies(spec.optimizer());
  const sharding::ModelStateBytes bytes = sharding::ZeroFormulaBytes(inputs);
  v1::ModelStateFormula formula;
  formula.set_parameters(parameters);
  formula.set_param_bytes(inputs.param_bytes);
  formula.set_grad_bytes(inputs.grad_bytes);
  formula.set_optimizer_state_copies(inputs.optimizer_state_copies);
  formula.set_params_bytes(bytes.params);
  formula.set_grads_bytes(bytes.grads);
  formula.set_master_bytes(bytes.master);
  formula.set_optimizer_state_bytes(bytes.optimizer_state);
  if (spec.mode() == v1::ZERO3) formula.set_gather_pool_bytes(gather_pool_bytes);
  return formula;
}

}  // namespace zeroshard::jobspec
