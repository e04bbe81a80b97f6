// MetricsFor: every engine memory category reaches its MemoryBreakdown field, and the total is
// the engine's counted total plus the memory held outside it.
#include "worker/daemon/step_metrics.h"

#include "gtest/gtest.h"
#include "worker/engine/engine.h"

namespace zeroshard::worker {
namespace {

using engine::MemoryCategory;

// Distinct values per category, so a field fed from the wrong category shows.
// Fails before the fix: gather_pool_bytes stayed 0 though the total counted the pool.
TEST(StepMetricsTest, EveryEngineCategoryIsReportedAndSummed) {
  engine::StepResult result;
  int64_t engine_total = 0;
  for (int c = 0; c < engine::kNumMemoryCategories; ++c) {
    result.memory.bytes[c] = int64_t{1000} << c;
    engine_total += result.memory.bytes[c];
  }
  OutsideEngineMemory outside;
  outside.comm_staging_bytes = 3;
  outside.workload_bytes = 5;
  outside.kernel_tables_bytes = 7;
  outside.checkpoint_staging_bytes = 9;
  const v1::StepMetrics metrics = MetricsFor(result, /*steps_done=*/4, IterationTimes(), outside,
                                             /*vmrss_at_start_bytes=*/0);
  const v1::MemoryBreakdown& memory = metrics.memory();
  EXPECT_EQ(metrics.step(), 4);
  EXPECT_EQ(memory.params_bytes(), result.memory.of(MemoryCategory::kParams));
  EXPECT_EQ(memory.grads_bytes(), result.memory.of(MemoryCategory::kGrads));
  EXPECT_EQ(memory.master_bytes(), result.memory.of(MemoryCategory::kMaster));
  EXPECT_EQ(memory.optimizer_state_bytes(), result.memory.of(MemoryCategory::kOptimizerState));
  EXPECT_EQ(memory.bucket_bytes(), result.memory.of(MemoryCategory::kBuckets));
  EXPECT_EQ(memory.comm_scratch_bytes(), result.memory.of(MemoryCategory::kCommScratch));
  EXPECT_EQ(memory.gather_pool_bytes(), result.memory.of(MemoryCategory::kGatherPool));
  EXPECT_EQ(memory.comm_staging_bytes(), 3);
  EXPECT_EQ(memory.workload_bytes(), 5);
  EXPECT_EQ(memory.kernel_tables_bytes(), 7);
  EXPECT_EQ(memory.checkpoint_staging_bytes(), 9);
  EXPECT_EQ(memory.total_bytes(), engine_total + 3 + 5 + 7 + 9);
  // The total is the sum of every other field (types.proto's MemoryBreakdown contract).
  EXPECT_EQ(memory.total_bytes(), memory.params_bytes() + memory.grads_bytes() +
                                      memory.master_bytes() + memory.optimizer_state_bytes() +
                                      memory.bucket_bytes() + memory.comm_scratch_bytes() +
                                      memory.gather_pool_bytes() + memory.comm_staging_bytes() +
                                      memory.workload_bytes() + memory.kernel_tables_bytes() +
                                      memory.checkpoint_staging_bytes());
}

}  // namespace
}  // namespace zeroshard::worker
