// Tests of zero3's gather geometry: modules from tensor names, their bucket spans, the windows.
#include "sharding/gather_windows.h"

#include <vector>

#include "gtest/gtest.h"
#include "sharding/shard_planner.h"

namespace zeroshard::sharding {
namespace {

TensorSpec Tensor(const char* name, int64_t elements) {
  return TensorSpec{name, {elements}, elements, 0.0, 1.0f};
}

TEST(GatherWindowsTest, ModuleIsTheNameUpToTheLastDot) {
  EXPECT_EQ(ModuleOfTensorName("4.weight"), "4");
  EXPECT_EQ(ModuleOfTensorName("blocks.0.attn.qkv.weight"), "blocks.0.attn.qkv");
  EXPECT_EQ(ModuleOfTensorName("scale"), "scale");
}

TEST(GatherWindowsTest, ModulesSpanTheBucketsTheirTensorsOverlap) {
  // Gradient-ready order as the catalog lists an MLP: 2.bias, 2.weight, 0.bias, 0.weight.
  std::vector<TensorSpec> tensors = {Tensor("2.bias", 100), Tensor("2.weight", 3000),
                                     Tensor("0.bias", 100), Tensor("0.weight", 5000)};
  ShardPlanOptions options;
  options.bucket_elems = 2048;
  absl::StatusOr<ShardPlan> plan = ShardPlan::Create(tensors, 2, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const GatherWindows windows = GatherWindowsFor(*plan);
  ASSERT_EQ(windows.modules.size(), 2u);
  EXPECT_EQ(windows.tensor_module, (std::vector<int64_t>{0, 0, 1, 1}));
  for (int64_t t = 0; t < plan->num_tensors(); ++t) {
    const ModuleRange& module = windows.modules[windows.tensor_module[t]];
    const TensorPlacement& placement = plan->placement(t);
    EXPECT_LE(module.first_bucket, placement.first_bucket) << t;
    EXPECT_GE(module.last_bucket, placement.first_bucket + placement.num_buckets - 1) << t;
    EXPECT_LE(module.flat_begin, placement.flat_offset) << t;
    EXPECT_GE(module.flat_end, placement.flat_end()) << t;
    EXPECT_LE(module.span_elems(), windows.window_elems) << t;
    EXPECT_LE(module.flat_begin, module.tensors_begin) << t;
    EXPECT_LE(module.tensors_begin, placement.flat_offset) << t;
    EXPECT_GE(module.tensors_end, placement.flat_end()) << t;
    EXPECT_LE(module.tensors_end, module.flat_end) << t;
  }
  // Module "2" covers [0, 3200) of the flat layout: buckets 0 and 1. Module "0" starts in
  // bucket 1 (shared) and ends in bucket 4.
  EXPECT_EQ(windows.modules[0].first_bucket, 0);
  EXPECT_EQ(windows.modules[0].last_bucket, 1);
  EXPECT_EQ(windows.modules[1].first_bucket, 1);
  EXPECT_EQ(windows.max_span_buckets, windows.modules[1].span_buckets());
  EXPECT_EQ(DefaultGatherPoolBuckets(*plan), 2 * windows.max_span_buckets);
  EXPECT_EQ(GatherPoolWindows(windows, DefaultGatherPoolBuckets(*plan)), 2);
  EXPECT_EQ(GatherPoolWindows(windows, windows.max_span_buckets * 3 + 1), 3);
  EXPECT_EQ(GatherPoolWindows(windows, 1), 1);
}

}  // namespace
}  // namespace zeroshard::sharding
