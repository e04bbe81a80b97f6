// sharding::RankMemoryNeed against the engine: for every mode, W = 1..4, several plans and
// precisions, the bytes the engine's counting allocator holds after Engine::Create on the CPU
// device equal the arithmetic, category by category. The coordinator refuses jobs by this
// arithmetic, so a buffer added to the engine without it would let a job through that cannot fit.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_optimizer.h"
#include "kernels/optimizer.h"
#include "numerics/dtype.h"
#include "sharding/rank_memory.h"
#include "sharding/shard_planner.h"
#include "sharding/test_plans.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/engine/counting_allocator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/engine.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;

// The arithmetic's CPU constants are the kernels' (sharding cannot depend on kernels).
static_assert(sharding::kCpuGradStatsChunkElements == kernels::kCpuChunkElements);
static_assert(sharding::kGradStatsChunkEntryBytes == sizeof(kernels::GradStatsChunk));

sharding::ZeroStage StageOf(EngineMode mode) {
  switch (mode) {
    case EngineMode::kDdp:
      return sharding::ZeroStage::kDdp;
    case EngineMode::kZero1:
      return sharding::ZeroStage::kZero1;
    case EngineMode::kZero2:
      return sharding::ZeroStage::kZero2;
    case EngineMode::kZero3:
      return sharding::ZeroStage::kZero3;
  }
  return sharding::ZeroStage::kDdp;
}

sharding::RankMemoryOptions OptionsOf(const EngineConfig& config) {
  sharding::RankMemoryOptions options;
  options.mode = StageOf(config.mode);
  options.param_dtype = config.param_dtype;
  options.grad_dtype = config.grad_dtype;
  options.reduce_dtype = config.reduce_dtype;
  options.state_arrays_per_param = kernels::StateArraysPerParam(config.optimizer);
  options.bucket_pool_size = config.bucket_pool_size;
  options.gather_pool_buckets = config.gather_pool_buckets;
  options.grad_stats_chunk_elements = HostDeviceOps(/*threads=*/1).GradStatsChunkElements();
  return options;
}

struct Precision {
  const char* name;
  DType param;
  DType grad;
  DType reduce;
};

struct Optimizer {
  const char* name;
  kernels::OptimizerKind kind;
  double momentum;
  bool amsgrad;
};

// Torch-style module names (module "<layer>", tensors "<layer>.weight", "<layer>.bias"), in
// gradient-ready order, as the catalog lists an MLP.
absl::StatusOr<sharding::ShardPlan> MlpPlan(const std::vector<int64_t>& widths, int64_t world_size,
                                            int64_t bucket_elems) {
  std::vector<sharding::TensorSpec> tensors;
  for (int layer = static_cast<int>(widths.size()) - 2; layer >= 0; --layer) {
    const int64_t in = widths[layer];
    const int64_t out = widths[layer + 1];
    tensors.push_back({absl::StrCat(2 * layer, ".bias"), {out}, out, 0.0, 1.0f});
    tensors.push_back({absl::StrCat(2 * layer, ".weight"), {out, in}, out * in, 0.0, 1.0f});
  }
  sharding::ShardPlanOptions options;
  options.bucket_elems = bucket_elems;
  return sharding::ShardPlan::Create(std::move(tensors), world_size, options);
}

struct NamedPlan {
  std::string name;
  sharding::ShardPlan plan;
};

std::vector<NamedPlan> Plans(int64_t world_size) {
  std::vector<NamedPlan> plans;
  auto add = [&](std::string name, absl::StatusOr<sharding::ShardPlan> plan) {
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
    plans.push_back({std::move(name), *std::move(plan)});
  };
  // Uneven one-dimensional tensors, large enough for several statistics chunks per rank.
  add("uneven", sharding::PlanOfSizes({262144, 1000, 131071, 300000, 7, 65536, 200003, 90000},
                                      world_size, 65536));
  // An MLP whose modules span several buckets, in small buckets.
  add("mlp", MlpPlan({300, 512, 512, 257, 10}, world_size, 4096));
  // One tensor, one bucket.
  add("single", sharding::PlanOfSizes({5000}, world_size, 1 << 20));
  return plans;
}

// Creates an engine for every rank of every plan, precision, optimizer and mode in `modes` (zero3
// also with an explicit gather pool) and compares its counted bytes with the arithmetic.
void ExpectCountedBytesEqualTheArithmetic(int world_size, const std::vector<EngineMode>& modes) {
  const Precision precisions[] = {
      {"fp32", DType::kFloat32, DType::kFloat32, DType::kFloat32},
      {"bf16", DType::kBFloat16, DType::kBFloat16, DType::kFloat32},
      {"bf16-reduce-bf16", DType::kBFloat16, DType::kBFloat16, DType::kBFloat16},
      {"fp32-params-bf16-grads", DType::kFloat32, DType::kBFloat16, DType::kFloat32},
      {"fp16-grads-bf16-reduce", DType::kFloat16, DType::kFloat16, DType::kBFloat16},
  };
  const Optimizer optimizers[] = {
      {"sgd", kernels::OptimizerKind::kSgd, 0.0, false},
      {"adam-amsgrad", kernels::OptimizerKind::kAdam, 0.0, true},
      {"adamw", kernels::OptimizerKind::kAdamW, 0.0, false},
  };
  for (const NamedPlan& named : Plans(world_size)) {
    for (const Precision& precision : precisions) {
      for (const Optimizer& optimizer : optimizers) {
        for (EngineMode mode : modes) {
          for (int gather_pool_buckets : {0, 5}) {
            if (mode != EngineMode::kZero3 && gather_pool_buckets != 0) continue;
            EngineConfig config;
            config.mode = mode;
            config.param_dtype = precision.param;
            config.grad_dtype = precision.grad;
            config.reduce_dtype = precision.reduce;
            config.optimizer.kind = optimizer.kind;
            config.optimizer.momentum = optimizer.momentum;
            config.optimizer.amsgrad = optimizer.amsgrad;
            config.bucket_pool_size = named.name == "mlp" ? 3 : 2;
            config.gather_pool_buckets = gather_pool_buckets;
            for (int rank = 0; rank < world_size; ++rank) {
              SCOPED_TRACE(absl::StrCat(named.name, " ", precision.name, " ", optimizer.name, " ",
                                        EngineModeName(mode), " pool ", gather_pool_buckets,
                                        " W=", world_size, " rank ", rank));
              comm::testing::IdentityCommunicator communicator(rank, world_size);
              absl::StatusOr<std::unique_ptr<Engine>> engine =
                  Engine::Create(named.plan, rank, config, &communicator);
              EXPECT_TRUE(engine.ok()) << engine.status();
              if (!engine.ok()) return;
              const absl::StatusOr<sharding::RankMemoryBytes> need =
                  sharding::RankMemoryNeed(named.plan, rank, OptionsOf(config));
              EXPECT_TRUE(need.ok()) << need.status();
              if (!need.ok()) return;
              const MemoryReport report = (*engine)->Memory();
              EXPECT_EQ(report.of(MemoryCategory::kParams), need->params);
              EXPECT_EQ(report.of(MemoryCategory::kGrads), need->grads);
              EXPECT_EQ(report.of(MemoryCategory::kMaster), need->master);
              EXPECT_EQ(report.of(MemoryCategory::kOptimizerState), need->optimizer_state);
              EXPECT_EQ(report.of(MemoryCategory::kBuckets), need->buckets);
              EXPECT_EQ(report.of(MemoryCategory::kGatherPool), need->gather_pool);
              EXPECT_EQ(report.of(MemoryCategory::kCommScratch), need->comm_scratch);
              EXPECT_EQ(report.total(), need->total) << report.ToString();
            }
          }
        }
      }
    }
  }
}

class EngineMemoryNeedTest : public ::testing::TestWithParam<int> {};

// Fails before the fix: sharding::RankMemoryNeed did not exist; the coordinator could compare a
// job with a worker's --memory_limit_bytes only through the ZeRO formula, which leaves out
// padding, bucket buffers and scratch.
TEST_P(EngineMemoryNeedTest, DdpZero1Zero2CountedBytesEqualTheArithmetic) {
  ExpectCountedBytesEqualTheArithmetic(GetParam(),
                                       {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2});
}

TEST_P(EngineMemoryNeedTest, Zero3CountedBytesEqualTheArithmetic) {
  ExpectCountedBytesEqualTheArithmetic(GetParam(), {EngineMode::kZero3});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EngineMemoryNeedTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("W", info.param);
                         });

}  // namespace
}  // namespace zeroshard::engine
