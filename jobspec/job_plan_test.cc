// Tests for the spec -> plan bridge: the seed model's plan and its API view, an attached
// model's tensors taken from its spec, and zero3's gather pool (its lower bound and its bytes).
#include "jobspec/job_plan.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "jobspec/job_spec_defaults.h"
#include "sharding/gather_windows.h"

namespace zeroshard::jobspec {
namespace {

v1::JobSpec SeedSpec() {
  v1::JobSpec spec;
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::SGD);
  return WithDefaults(spec);
}

// A small transformer-like list, in gradient-ready order, with a scalar and a 3-d tensor.
v1::JobSpec AttachedSpec() {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_weight_decay(0.1);
  v1::AttachedModel& attached = *spec.mutable_workload()->mutable_attached();
  const std::pair<const char*, std::vector<int64_t>> tensors[] = {{"head.bias", {65}},
                                                                  {"head.weight", {65, 128}},
                                                                  {"temperature", {}},
                                                                  {"blocks.0.conv", {4, 3, 3}},
                                                                  {"embed.weight", {65, 128}}};
  for (const auto& [name, shape] : tensors) {
    v1::AttachedTensor& tensor = *attached.add_tensors();
    tensor.set_name(name);
    for (int64_t dim : shape) tensor.add_shape(dim);
  }
  attached.add_workers("node-b");
  attached.add_workers("node-a");
  return WithDefaults(spec);
}

TEST(JobPlanTest, AttachedTensorsAreTheSpecsInItsOrder) {
  const v1::JobSpec spec = AttachedSpec();
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = TensorsForJob(spec);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(static_cast<int>(tensors->size()), spec.workload().attached().tensors_size());
  for (int t = 0; t < spec.workload().attached().tensors_size(); ++t) {
    const v1::AttachedTensor& given = spec.workload().attached().tensors(t);
    const sharding::TensorSpec& got = (*tensors)[t];
    EXPECT_EQ(got.name, given.name());
    EXPECT_EQ(got.shape, std::vector<int64_t>(given.shape().begin(), given.shape().end()));
    int64_t elements = 1;
    for (int64_t dim : given.shape()) elements *= dim;
    EXPECT_EQ(got.num_elements, elements) << got.name;
    EXPECT_EQ(got.weight_decay, 0.1) << got.name;
    EXPECT_EQ(got.lr_scale, 1.0f) << got.name;
  }
  EXPECT_EQ((*tensors)[2].num_elements, 1) << "a scalar has one element";
}

TEST(JobPlanTest, AttachedTensorsTakeTheirGroupsAndThePlanCoversThem) {
  v1::JobSpec spec = AttachedSpec();
  v1::ParamGroup& no_decay = *spec.add_param_groups();
  no_decay.add_patterns("*.bias");
  no_decay.add_patterns("temperature");
  no_decay.set_weight_decay(0);
  v1::ParamGroup& slow_embed = *spec.add_param_groups();
  slow_embed.add_patterns("embed.*");
  slow_embed.set_lr_scale(0.5);
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = TensorsForJob(spec);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  const double decay[] = {0, 0.1, 0, 0.1, 0.1};
  const float lr_scale[] = {1, 1, 1, 1, 0.5f};
  for (size_t t = 0; t < tensors->size(); ++t) {
    EXPECT_EQ((*tensors)[t].weight_decay, decay[t]) << (*tensors)[t].name;
    EXPECT_EQ((*tensors)[t].lr_scale, lr_scale[t]) << (*tensors)[t].name;
  }

  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tensor_elems(), 65 + 65 * 128 + 1 + 4 * 3 * 3 + 65 * 128);
  absl::StatusOr<v1::ShardPlan> view = PlanToProto(*plan, 0, /*include_layout=*/true);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->tensors_size(), 5);
  for (int t = 0; t < view->tensors_size(); ++t) {
    EXPECT_EQ(view->tensors(t).name(), spec.workload().attached().tensors(t).name());
    EXPECT_EQ(view->tensors(t).weight_decay(), decay[t]);
  }
}

TEST(JobPlanTest, AttachedLayoutHashCoversNamesShapesAndGroups) {
  const v1::JobSpec base = AttachedSpec();
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(base, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The pinned workers are not part of the layout: the same model on other workers plans alike.
  v1::JobSpec other_workers = base;
  other_workers.mutable_workload()->mutable_attached()->set_workers(0, "node-c");
  EXPECT_EQ(PlanForJob(other_workers, 2)->layout_hash(), plan->layout_hash());
  v1::JobSpec renamed = base;
  renamed.mutable_workload()->mutable_attached()->mutable_tensors(1)->set_name("lm_head.weight");
  EXPECT_NE(PlanForJob(renamed, 2)->layout_hash(), plan->layout_hash());
  // Same element count, another shape.
  v1::JobSpec reshaped = base;
  v1::AttachedTensor& conv = *reshaped.mutable_workload()->mutable_attached()->mutable_tensors(3);
  conv.set_shape(0, 3);
  conv.set_shape(1, 4);
  EXPECT_NE(PlanForJob(reshaped, 2)->layout_hash(), plan->layout_hash());
  v1::JobSpec grouped = base;
  v1::ParamGroup& group = *grouped.add_param_groups();
  group.add_patterns("head.*");
  group.set_lr_scale(2);
  EXPECT_NE(PlanForJob(grouped, 2)->layout_hash(), plan->layout_hash());
}

TEST(JobPlanTest, AttachedShapesThatCannotBePlannedAreRefused) {
  v1::JobSpec spec = AttachedSpec();
  spec.mutable_workload()->mutable_attached()->mutable_tensors(3)->set_shape(1, 0);
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = TensorsForJob(spec);
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(tensors.status().message(), "workload.attached.tensors[3].shape: "))
      << tensors.status();
  // Dimensions whose product overflows int64 are refused, not wrapped around.
  spec = AttachedSpec();
  v1::AttachedTensor& huge = *spec.mutable_workload()->mutable_attached()->mutable_tensors(0);
  for (int d = 0; d < 5; ++d) huge.add_shape(int64_t{1} << 20);
  tensors = TensorsForJob(spec);
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(tensors.status().message(), "workload.attached.tensors[0].shape: "))
      << tensors.status();
}

TEST(JobPlanTest, SeedModelPlanCoversEveryElementOnce) {
  for (int64_t world_size : {1, 2, 4}) {
    absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(SeedSpec(), world_size);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->tensor_elems(), 10 * 64 + 64 + 64 * 10 + 10);
    int64_t covered = 0;
    for (int64_t rank = 0; rank < world_size; ++rank) {
      absl::StatusOr<v1::ShardPlan> view = PlanToProto(*plan, rank, /*include_layout=*/rank == 0);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(view->layout_hash(), plan->layout_hash());
      EXPECT_EQ(view->tensors_size(), rank == 0 ? 4 : 0);
      for (const v1::PlanPiece& piece : view->pieces()) {
        for (const v1::PlanFragment& fragment : piece.fragments()) {
          covered += fragment.end() - fragment.begin();
          EXPECT_GE(fragment.flat_offset(), piece.flat_begin());
          EXPECT_LE(fragment.flat_offset() + fragment.end() - fragment.begin(), piece.flat_end());
        }
      }
    }
    EXPECT_EQ(covered, plan->tensor_elems());
  }
}

TEST(JobPlanTest, TensorsHaveTorchNamesAndTheDefaultGroupDecaysEveryTensor) {
  v1::JobSpec spec = SeedSpec();
  spec.mutable_optimizer()->set_weight_decay(0.05);
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = TensorsForJob(spec);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 4u);
  const char* const names[] = {"2.bias", "2.weight", "0.bias", "0.weight"};
  EXPECT_EQ(GroupIndexOfEachTensor(spec, {names, names + 4}), (std::vector<int>(4, -1)));
  for (size_t t = 0; t < tensors->size(); ++t) {
    EXPECT_EQ((*tensors)[t].name, names[t]);
    EXPECT_EQ((*tensors)[t].weight_decay, 0.05) << names[t];
    EXPECT_EQ((*tensors)[t].lr_scale, 1.0f) << names[t];
  }
}

TEST(JobPlanTest, FirstMatchingGroupWinsAndUnsetFieldsTakeTheOptimizers) {
  v1::JobSpec spec = SeedSpec();
  spec.mutable_optimizer()->set_weight_decay(0.05);
  v1::ParamGroup& no_decay = *spec.add_param_groups();
  no_decay.add_patterns("*.bias");
  no_decay.set_weight_decay(0);
  v1::ParamGroup& first_layer = *spec.add_param_groups();
  first_layer.add_patterns("no-such-tensor");
  first_layer.add_patterns("0.[bw]*");
  first_layer.set_lr_scale(0.25);
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = TensorsForJob(spec);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 4u);
  // 2.bias and 0.bias: the no-decay group, which comes first, though 0.bias matches both.
  for (size_t t : {0u, 2u}) {
    EXPECT_EQ((*tensors)[t].weight_decay, 0.0) << (*tensors)[t].name;
    EXPECT_EQ((*tensors)[t].lr_scale, 1.0f) << (*tensors)[t].name;
  }
  EXPECT_EQ(GroupIndexOfEachTensor(spec, {"2.bias", "2.weight", "0.bias", "0.weight"}),
            (std::vector<int>{0, -1, 0, 1}));
  // 2.weight: no group, the optimizer's values.
  EXPECT_EQ((*tensors)[1].weight_decay, 0.05);
  EXPECT_EQ((*tensors)[1].lr_scale, 1.0f);
  // 0.weight: the second group, which leaves weight decay unset.
  EXPECT_EQ((*tensors)[3].weight_decay, 0.05);
  EXPECT_EQ((*tensors)[3].lr_scale, 0.25f);
  // Patterns match whole names: "*.bias" does not match "2.bias.extra", nor "0.[bw]*" "10.weight".
  EXPECT_EQ(GroupIndexOfEachTensor(spec, {"2.bias.extra", "10.weight"}),
            (std::vector<int>{-1, -1}));
}

TEST(JobPlanTest, LayoutHashCoversTheGroups) {
  v1::JobSpec spec = SeedSpec();
  absl::StatusOr<sharding::ShardPlan> without_groups = PlanForJob(spec, 2);
  ASSERT_TRUE(without_groups.ok()) << without_groups.status();
  v1::ParamGroup& group = *spec.add_param_groups();
  group.add_patterns("*.bias");
  group.set_lr_scale(0.5);
  absl::StatusOr<sharding::ShardPlan> with_lr_scale = PlanForJob(spec, 2);
  ASSERT_TRUE(with_lr_scale.ok()) << with_lr_scale.status();
  EXPECT_NE(with_lr_scale->layout_hash(), without_groups->layout_hash());
  // SeedSpec is SGD with weight decay 0, so a no-decay group alone would change nothing.
  spec.mutable_optimizer()->set_weight_decay(0.01);
  absl::StatusOr<sharding::ShardPlan> decay_everywhere = PlanForJob(spec, 2);
  group.clear_lr_scale();
  group.set_weight_decay(0);
  absl::StatusOr<sharding::ShardPlan> decay_but_biases = PlanForJob(spec, 2);
  ASSERT_TRUE(decay_everywhere.ok() && decay_but_biases.ok());
  EXPECT_NE(decay_everywhere->layout_hash(), decay_but_biases->layout_hash());

  absl::StatusOr<v1::ShardPlan> view = PlanToProto(*decay_but_biases, 0, /*include_layout=*/true);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->tensors_size(), 4);
  for (const v1::PlanTensor& tensor : view->tensors()) {
    EXPECT_EQ(tensor.weight_decay(), absl::EndsWith(tensor.name(), ".bias") ? 0.0 : 0.01)
        << tensor.name();
  }
}

TEST(JobPlanTest, ErrorsNameTheField) {
  v1::JobSpec spec = SeedSpec();
  spec.mutable_workload()->set_preset("huge");
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("workload"), absl::string_view::npos);
  EXPECT_FALSE(PlanToProto(*PlanForJob(SeedSpec(), 2), 2, false).ok());
}

// Issue 26: an attached model's groups list their tensors by index; patterns still match names,
// and the first group that claims a tensor wins.
TEST(JobPlanTest, GroupsByIndexAndByPattern) {
  v1::JobSpec spec;
  v1::ParamGroup& by_index = *spec.add_param_groups();
  by_index.add_tensors(2);
  by_index.add_tensors(0);
  spec.add_param_groups()->add_patterns("*.bias");
  EXPECT_EQ(GroupIndexOfEachTensor(spec, {"0.weight", "0.bias", "2.bias", "2.weight"}),
            (std::vector<int>{0, 1, 0, -1}));
}

TEST(JobPlanTest, ModelStateFormulaFollowsTheSpecsModePrecisionAndOptimizer) {
  v1::JobSpec spec;
  spec.set_mode(v1::ZERO2);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  const v1::ModelStateFormula fp32 = ModelStateFormulaForJob(spec, 4, 1000);
  EXPECT_EQ(fp32.parameters(), 1000);
  EXPECT_EQ(fp32.param_bytes(), 4);
  EXPECT_EQ(fp32.grad_bytes(), 4);
  EXPECT_EQ(fp32.optimizer_state_copies(), 2);
  EXPECT_EQ(fp32.params_bytes(), 4000);
  EXPECT_EQ(fp32.grads_bytes(), 1000);
  EXPECT_EQ(fp32.master_bytes(), 0);
  EXPECT_EQ(fp32.optimizer_state_bytes(), 2000);

  spec.set_mode(v1::DDP);
  spec.mutable_precision()->set_param_dtype(v1::BFLOAT16);
  spec.mutable_optimizer()->set_amsgrad(true);
  const v1::ModelStateFormula bf16 = ModelStateFormulaForJob(spec, 4, 1000);
  EXPECT_EQ(bf16.param_bytes(), 2);
  EXPECT_EQ(bf16.grad_bytes(), 2);  // unset: the parameters' dtype
  EXPECT_EQ(bf16.optimizer_state_copies(), 3);
  EXPECT_EQ(bf16.master_bytes(), 4000);
  EXPECT_EQ(bf16.optimizer_state_bytes(), 12000);

  v1::JobSpec sgd;
  sgd.mutable_optimizer()->set_kind(v1::SGD);
  EXPECT_EQ(ModelStateFormulaForJob(sgd, 2, 10).optimizer_state_copies(), 0);
  sgd.mutable_optimizer()->set_momentum(0.9);
  sgd.set_mode(v1::ZERO1);
  EXPECT_EQ(ModelStateFormulaForJob(sgd, 2, 10).optimizer_state_bytes(), 20);
}

// Two 64x64 layers at the smallest bucket: each module's 4096 + 64 elements span several buckets.
v1::JobSpec Zero3Spec() {
  v1::JobSpec spec;
  spec.mutable_workload()->add_layer_sizes(64);
  spec.mutable_workload()->add_layer_sizes(64);
  spec.mutable_workload()->add_layer_sizes(64);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_mode(v1::ZERO3);
  spec.set_bucket_elems(1024);
  return WithDefaults(spec);
}

// Fails before the fix: PlanForJob planned any pool, so a zero3 job whose pool cannot hold one
// module's buckets was accepted at submission.
TEST(JobPlanTest, Zero3PoolBelowTheLargestModuleSpanIsRefusedNamingBothNumbers) {
  v1::JobSpec spec = Zero3Spec();
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t most = sharding::GatherWindowsFor(*plan).max_span_buckets;
  ASSERT_GT(most, 1);
  spec.set_gather_pool_buckets(static_cast<int32_t>(most - 1));
  plan = PlanForJob(spec, 2);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(
      plan.status().message(),
      absl::StrCat("gather_pool_buckets: ", most - 1,
                   " is below the most buckets one module spans (", most, " at bucket_elems ")))
      << plan.status();
  spec.set_gather_pool_buckets(static_cast<int32_t>(most));
  EXPECT_TRUE(PlanForJob(spec, 2).ok());
  // Other modes never have a pool (validation refuses the field for them).
  spec.set_mode(v1::ZERO2);
  spec.set_gather_pool_buckets(1);
  EXPECT_TRUE(PlanForJob(spec, 2).ok());
}

// Fails before the fix: the formula had no pool, so zero3's figure left out its gather buffers.
TEST(JobPlanTest, Zero3FormulaShardsTheParametersAndAddsThePool) {
  v1::JobSpec spec = Zero3Spec();
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const sharding::GatherWindows windows = sharding::GatherWindowsFor(*plan);
  // Unset: twice the largest span, which is two windows of the largest module's span.
  const int64_t pool = GatherPoolBytesForJob(spec, *plan);
  EXPECT_EQ(pool, 2 * windows.window_elems * 4);
  spec.set_gather_pool_buckets(static_cast<int32_t>(3 * windows.max_span_buckets));
  EXPECT_EQ(GatherPoolBytesForJob(spec, *plan), 3 * windows.window_elems * 4);
  spec.mutable_precision()->set_param_dtype(v1::BFLOAT16);
  EXPECT_EQ(GatherPoolBytesForJob(spec, *plan), 3 * windows.window_elems * 2);
  spec.mutable_precision()->set_param_dtype(v1::FLOAT32);

  const v1::ModelStateFormula zero3 = ModelStateFormulaForJob(spec, 4, 1000, pool);
  EXPECT_EQ(zero3.params_bytes(), 1000);  // 4000 over W = 4
  EXPECT_EQ(zero3.grads_bytes(), 1000);
  EXPECT_EQ(zero3.optimizer_state_bytes(), 2000);
  EXPECT_EQ(zero3.gather_pool_bytes(), pool);
  spec.set_mode(v1::ZERO2);
  spec.clear_gather_pool_buckets();
  EXPECT_EQ(GatherPoolBytesForJob(spec, *plan), 0);
  EXPECT_EQ(ModelStateFormulaForJob(spec, 4, 1000, pool).gather_pool_bytes(), 0);
}

}  // namespace
}  // namespace zeroshard::jobspec
