// Tests of a job spec's per-rank memory need: the spec's fields reach the arithmetic.
#include "jobspec/job_memory.h"

#include "gtest/gtest.h"
#include "jobspec/job_plan.h"
#include "jobspec/job_spec_defaults.h"

namespace zeroshard::jobspec {
namespace {

v1::JobSpec DeepAdamW() {
  v1::JobSpec spec;
  spec.set_name("deep");
  spec.mutable_workload()->set_preset("deep");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_mode(v1::ZERO2);
  return WithDefaults(spec, "job-000001");
}

// Fails before the fix: nothing turned a job spec into a per-rank memory need.
TEST(JobMemoryTest, OptionsFollowTheSpec) {
  v1::JobSpec spec = DeepAdamW();
  spec.mutable_precision()->set_param_dtype(v1::BFLOAT16);
  spec.mutable_precision()->set_grad_dtype(v1::FLOAT16);
  spec.mutable_precision()->set_reduce_dtype(v1::BFLOAT16);
  spec.set_gather_pool_buckets(6);
  absl::StatusOr<sharding::RankMemoryOptions> options =
      RankMemoryOptionsForJob(spec, v1::ZERO3, v1::CUDA);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->mode, sharding::ZeroStage::kZero3);
  EXPECT_EQ(options->param_dtype, numerics::DType::kBFloat16);
  EXPECT_EQ(options->grad_dtype, numerics::DType::kFloat16);
  EXPECT_EQ(options->reduce_dtype, numerics::DType::kBFloat16);
  EXPECT_EQ(options->state_arrays_per_param, 2);  // AdamW: exp_avg, exp_avg_sq
  EXPECT_EQ(options->gather_pool_buckets, 6);
  EXPECT_EQ(options->grad_stats_chunk_elements, kCudaGradStatsChunkElements);
  // The pool is zero3's alone; CPU workers cut statistics chunks of their own size.
  options = RankMemoryOptionsForJob(spec, v1::ZERO2, v1::CPU);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->gather_pool_buckets, 0);
  EXPECT_EQ(options->grad_stats_chunk_elements, sharding::kCpuGradStatsChunkElements);

  spec.mutable_precision()->set_param_dtype(v1::FLOAT64);
  const absl::Status refused = RankMemoryOptionsForJob(spec, v1::ZERO2, v1::CPU).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("precision.param_dtype"), absl::string_view::npos) << refused;
}

TEST(JobMemoryTest, NeedIsTheLargestRanksOnTheJobsPlan) {
  const v1::JobSpec spec = DeepAdamW();
  absl::StatusOr<sharding::RankMemoryBytes> zero2 = JobMemoryNeed(spec, v1::ZERO2, 4);
  absl::StatusOr<sharding::RankMemoryBytes> zero3 = JobMemoryNeed(spec, v1::ZERO3, 4);
  absl::StatusOr<sharding::RankMemoryBytes> ddp = JobMemoryNeed(spec, v1::DDP, 4);
  ASSERT_TRUE(zero2.ok() && zero3.ok() && ddp.ok());
  absl::StatusOr<sharding::ShardPlan> plan = PlanForJob(spec, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<sharding::RankMemoryOptions> options =
      RankMemoryOptionsForJob(spec, v1::ZERO2, v1::CPU);
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(zero2->total, sharding::MaxRankMemoryNeed(*plan, *options)->total);
  // The deep preset: 71,339,008 fp32 parameters; zero3 keeps a quarter of them plus its pool.
  EXPECT_LT(zero3->total, zero2->total);
  EXPECT_LT(zero2->total, ddp->total);
  EXPECT_GT(zero3->gather_pool, 0);
  EXPECT_EQ(zero3->params * 4, plan->padded_elems() * 4);
}

}  // namespace
}  // namespace zeroshard::jobspec
