// Tests of the per-rank memory arithmetic. The engine's own agreement with it (byte for byte, per
// mode, W and dtype) is worker/engine:engine_memory_need_test; these pin the arithmetic itself.
#include "sharding/rank_memory.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sharding/gather_windows.h"
#include "sharding/test_plans.h"

namespace zeroshard::sharding {
namespace {

using numerics::DType;

ShardPlan Plan(const std::vector<int64_t>& sizes, int64_t world_size, int64_t bucket_elems) {
  absl::StatusOr<ShardPlan> plan = PlanOfSizes(sizes, world_size, bucket_elems);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

int64_t LargestBucket(const ShardPlan& plan) {
  int64_t largest = 0;
  for (const BucketLayout& bucket : plan.buckets())
    largest = std::max(largest, bucket.padded_elems);
  return largest;
}

// Fails before the fix: RankMemoryNeed did not exist (the coordinator had only the ZeRO formula,
// which leaves out padding, bucket buffers and scratch).
TEST(RankMemoryTest, DdpFp32HoldsTheWholeLayoutOnce) {
  // One tensor of 1000 elements in one bucket: one statistics chunk.
  const ShardPlan plan = Plan({1000}, 1, 4096);
  RankMemoryOptions options;
  options.mode = ZeroStage::kDdp;
  options.state_arrays_per_param = 1;  // SGD with momentum
  absl::StatusOr<RankMemoryBytes> need = RankMemoryNeed(plan, 0, options);
  ASSERT_TRUE(need.ok()) << need.status();
  const int64_t padded = plan.padded_elems();
  EXPECT_EQ(need->params, padded * 4);
  EXPECT_EQ(need->grads, padded * 4);
  EXPECT_EQ(need->master, 0);
  EXPECT_EQ(need->optimizer_state, padded * 4);
  EXPECT_EQ(need->buckets, 0);  // fp32 gradients reduced in fp32 in place: no pool, no staging
  EXPECT_EQ(need->gather_pool, 0);
  EXPECT_EQ(need->comm_scratch, 48 + 4 + 1 * (16 + 8));
  EXPECT_EQ(need->total, need->params + need->grads + need->optimizer_state + need->comm_scratch);
}

TEST(RankMemoryTest, ShardedModesHoldTheirShares) {
  const ShardPlan plan = Plan({300000, 7, 70000, 1000}, 4, 65536);
  const int64_t padded = plan.padded_elems();
  const int64_t owned = plan.elems_per_rank();
  const int64_t largest = LargestBucket(plan);
  RankMemoryOptions options;
  options.param_dtype = DType::kBFloat16;
  options.grad_dtype = DType::kBFloat16;
  options.state_arrays_per_param = 2;  // Adam

  options.mode = ZeroStage::kZero1;
  absl::StatusOr<RankMemoryBytes> zero1 = RankMemoryNeed(plan, 1, options);
  ASSERT_TRUE(zero1.ok()) << zero1.status();
  EXPECT_EQ(zero1->params, padded * 2);
  EXPECT_EQ(zero1->grads, padded * 2);
  EXPECT_EQ(zero1->master, owned * 4);
  EXPECT_EQ(zero1->optimizer_state, 2 * owned * 4);
  // bf16 gradients reduced in fp32: the pool of 2 fp32 buckets, and the fp32 staging buffer.
  EXPECT_EQ(zero1->buckets, 2 * largest * 4 + largest * 4);
  EXPECT_EQ(zero1->gather_pool, 0);

  options.mode = ZeroStage::kZero2;
  absl::StatusOr<RankMemoryBytes> zero2 = RankMemoryNeed(plan, 1, options);
  ASSERT_TRUE(zero2.ok()) << zero2.status();
  EXPECT_EQ(zero2->params, padded * 2);
  EXPECT_EQ(zero2->grads, owned * 2);
  EXPECT_EQ(zero2->buckets, zero1->buckets);

  options.mode = ZeroStage::kZero3;
  absl::StatusOr<RankMemoryBytes> zero3 = RankMemoryNeed(plan, 1, options);
  ASSERT_TRUE(zero3.ok()) << zero3.status();
  EXPECT_EQ(zero3->params, owned * 2);
  EXPECT_EQ(zero3->grads, zero2->grads);
  EXPECT_EQ(zero3->master, zero2->master);
  EXPECT_EQ(zero3->optimizer_state, zero2->optimizer_state);
  EXPECT_EQ(zero3->buckets, zero2->buckets);
  EXPECT_EQ(zero3->comm_scratch, zero2->comm_scratch);
  EXPECT_EQ(zero3->gather_pool, GatherPoolBytes(plan, 0, DType::kBFloat16));
  EXPECT_GT(zero3->gather_pool, 0);
}

TEST(RankMemoryTest, GatherPoolIsWholeWindowsOfTheLargestModule) {
  // Modules are names up to the last '.': "t<i>" are their own modules.
  const ShardPlan plan = Plan({5000, 5000, 5000, 5000}, 2, 2048);
  const GatherWindows windows = GatherWindowsFor(plan);
  // Default: two windows (one module in use, the next prefetched).
  EXPECT_EQ(GatherPoolBytes(plan, 0, DType::kFloat32), 2 * windows.window_elems * 4);
  EXPECT_EQ(GatherPoolBytes(plan, 3 * windows.max_span_buckets, DType::kBFloat16),
            3 * windows.window_elems * 2);
  // A pool smaller than one window still holds one.
  EXPECT_EQ(GatherPoolBytes(plan, 1, DType::kFloat32), windows.window_elems * 4);
}

TEST(RankMemoryTest, ZeroThreeNeedsLessThanZeroTwoOnADeepModel) {
  // 16 equal layers of weight + bias, as the deep preset lays them out.
  std::vector<TensorSpec> tensors;
  for (int layer = 15; layer >= 0; --layer) {
    tensors.push_back(TensorSpec{absl::StrCat(layer, ".bias"), {512}, 512, 0.0, 1.0f});
    tensors.push_back(TensorSpec{absl::StrCat(layer, ".weight"), {512, 512}, 512 * 512, 0.0, 1.0f});
  }
  ShardPlanOptions plan_options;
  plan_options.bucket_elems = 1 << 16;
  absl::StatusOr<ShardPlan> plan = ShardPlan::Create(tensors, 4, plan_options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RankMemoryOptions options;
  options.state_arrays_per_param = 2;
  options.mode = ZeroStage::kZero2;
  absl::StatusOr<RankMemoryBytes> zero2 = MaxRankMemoryNeed(*plan, options);
  options.mode = ZeroStage::kZero3;
  absl::StatusOr<RankMemoryBytes> zero3 = MaxRankMemoryNeed(*plan, options);
  ASSERT_TRUE(zero2.ok() && zero3.ok());
  EXPECT_LT(zero3->total, zero2->total);
  EXPECT_EQ(zero2->total - zero3->total,
            plan->padded_elems() * 4 - plan->elems_per_rank() * 4 - zero3->gather_pool);
}

TEST(RankMemoryTest, RanksDifferOnlyInStatisticsChunksAndTheMaxCoversThemAll) {
  // Small chunks, so the ranks' fragments cut into different numbers of chunks.
  const ShardPlan plan = Plan({3000, 17, 900, 5000}, 3, 1024);
  RankMemoryOptions options;
  options.grad_stats_chunk_elements = 100;
  absl::StatusOr<RankMemoryBytes> most = MaxRankMemoryNeed(plan, options);
  ASSERT_TRUE(most.ok()) << most.status();
  for (int64_t rank = 0; rank < 3; ++rank) {
    absl::StatusOr<RankMemoryBytes> need = RankMemoryNeed(plan, rank, options);
    ASSERT_TRUE(need.ok()) << need.status();
    EXPECT_LE(need->total, most->total) << rank;
    EXPECT_EQ(need->total - need->comm_scratch, most->total - most->comm_scratch) << rank;
  }
}

TEST(RankMemoryTest, RefusesARankOutsideThePlanAndOptionsOutOfRange) {
  const ShardPlan plan = Plan({1000}, 2, 4096);
  RankMemoryOptions options;
  EXPECT_EQ(RankMemoryNeed(plan, 2, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.bucket_pool_size = 0;
  absl::Status status = RankMemoryNeed(plan, 0, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bucket_pool_size"), absl::string_view::npos) << status;
  options = {};
  options.gather_pool_buckets = -1;
  status = RankMemoryNeed(plan, 0, options).status();
  EXPECT_NE(status.message().find("gather_pool_buckets"), absl::string_view::npos) << status;
  options = {};
  options.grad_stats_chunk_elements = 0;
  status = RankMemoryNeed(plan, 0, options).status();
  EXPECT_NE(status.message().find("grad_stats_chunk_elements"), absl::string_view::npos) << status;
}

TEST(RankMemoryTest, BreakdownNamesTheNonZeroCategoriesInMiB) {
  RankMemoryBytes need;
  need.params = 100 << 20;
  need.optimizer_state = 3 << 19;
  EXPECT_EQ(need.Breakdown(), "params=100.0 MiB, optimizer_state=1.5 MiB");
  EXPECT_EQ(FormatMiB(412 << 20), "412.0 MiB");
}

}  // namespace
}  // namespace zeroshard::sharding
