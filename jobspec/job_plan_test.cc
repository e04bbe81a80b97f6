// Tests for the spec -> plan bridge: the seed model's plan and its API view.
#include "jobspec/job_plan.h"

#include "gtest/gtest.h"
#include "jobspec/job_spec_defaults.h"

namespace zeroshard::jobspec {
namespace {

v1::JobSpec SeedSpec() {
  v1::JobSpec spec;
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::SGD);
  return WithDefaults(spec);
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

TEST(JobPlanTest, ErrorsNameTheField) {
  v1::JobSpec spec = SeedSpec();
  spec.mutable_workload()->set_preset("huge");
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("workload"), absl::string_view::npos);
  EXPECT_FALSE(PlanToProto(*PlanForJob(SeedSpec(), 2), 2, false).ok());
}

}  // namespace
}  // namespace zeroshard::jobspec
