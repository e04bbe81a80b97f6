// The engine's memory report, read from its counting allocator, against the ZeRO formulas for
// Adam with bf16 parameters and gradients and fp32 master weights, per rank (Ψ = parameters):
// ddp 16Ψ, zero1 4Ψ + 12Ψ/W, zero2 2Ψ + 14Ψ/W, plus bucket buffers and padding, for W in {1,2,4}.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "numerics/dtype.h"
#include "sharding/test_plans.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;

// The memory checks run no collective: a communicator that only knows its place in the group.
using PlaceholderCommunicator = comm::testing::IdentityCommunicator;

// One-dimensional tensors of `sizes`, in buckets of 64Ki elements.
sharding::ShardPlan PlanOfSizes(const std::vector<int64_t>& sizes, int64_t world_size) {
  auto plan = sharding::PlanOfSizes(sizes, world_size, 65536);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// About 1.05M parameters in tensors of uneven sizes.
sharding::ShardPlan MemoryPlan(int64_t world_size) {
  return PlanOfSizes({262144, 1000, 131071, 300000, 7, 65536, 200003, 90000}, world_size);
}

EngineConfig AdamBf16Config(EngineMode mode) {
  EngineConfig config;
  config.mode = mode;
  config.optimizer.kind = kernels::OptimizerKind::kAdam;
  config.param_dtype = DType::kBFloat16;
  config.grad_dtype = DType::kBFloat16;
  return config;
}

// The engine's own communication scratch on the host device: the 6-double statistics buffer, one
// float per tensor (which ranks have a gradient for it), and for every statistics chunk (each owned
// fragment cut into chunks of the CPU's GradStatsChunkElements()) one table entry and one fp64
// partial sum.
int64_t StatisticsScratchBytes(const sharding::ShardPlan& plan, int64_t rank) {
  const absl::StatusOr<sharding::RankView> view = plan.ViewForRank(rank);
  EXPECT_TRUE(view.ok()) << view.status();
  if (!view.ok()) return 0;
  const int64_t chunk_elems = HostDeviceOps(/*threads=*/1).GradStatsChunkElements();
  int64_t chunks = 0;
  for (const sharding::TensorFragment& fragment : view->fragments()) {
    chunks += (fragment.size() + chunk_elems - 1) / chunk_elems;
  }
  return 6 * 8 + plan.num_tensors() * 4 +
         chunks * static_cast<int64_t>(sizeof(kernels::GradStatsChunk) + sizeof(double));
}

int64_t LargestBucket(const sharding::ShardPlan& plan) {
  int64_t largest = 0;
  for (const sharding::BucketLayout& bucket : plan.buckets())
    largest = std::max(largest, bucket.padded_elems);
  return largest;
}

class EngineMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(EngineMemoryTest, ReportedBytesFollowTheZeroFormulas) {
  const int world_size = GetParam();
  const sharding::ShardPlan plan = MemoryPlan(world_size);
  const double psi = static_cast<double>(plan.tensor_elems());
  const double padding = static_cast<double>(plan.padded_elems() - plan.tensor_elems());
  // Padding (alignment gaps and bucket tails) stays small, so the tolerances below are tight.
  ASSERT_LT(padding, 0.01 * psi);
  const double w = world_size;
  struct Expectation {
    EngineMode mode;
    double replicated_bytes_per_param;  // kept whole on every rank
    double sharded_bytes_per_param;     // divided among the W ranks
  };
  const Expectation expectations[] = {
      {EngineMode::kDdp, 16.0, 0.0},    // 2 params + 2 grads + 4 master + 8 Adam state
      {EngineMode::kZero1, 4.0, 12.0},  // 2 params + 2 grads; 4 master + 8 state sharded
      {EngineMode::kZero2, 2.0, 14.0},  // 2 params; 2 grads + 4 master + 8 state sharded
  };
  int64_t ddp_state_bytes = 0;
  for (const Expectation& expected : expectations) {
    for (int rank = 0; rank < world_size; ++rank) {
      SCOPED_TRACE(absl::StrCat(EngineModeName(expected.mode), " W=", world_size, " rank ", rank));
      PlaceholderCommunicator communicator(rank, world_size);
      auto engine = Engine::Create(plan, rank, AdamBf16Config(expected.mode), &communicator);
      ASSERT_TRUE(engine.ok()) << engine.status();
      const MemoryReport report = (*engine)->Memory();
      const int64_t model_state =
          report.of(MemoryCategory::kParams) + report.of(MemoryCategory::kGrads) +
          report.of(MemoryCategory::kMaster) + report.of(MemoryCategory::kOptimizerState);
      const double formula =
          expected.replicated_bytes_per_param * psi + expected.sharded_bytes_per_param * psi / w;
      // Padding elements are stored like parameters: at most the formula's bytes per element.
      const double tolerance = expected.replicated_bytes_per_param * padding +
                               expected.sharded_bytes_per_param * padding / w;
      EXPECT_GE(model_state, formula);
      EXPECT_LE(model_state, formula + tolerance) << report.ToString();
      // bf16 gradients are reduced in fp32 (the default), through a pool of 2 bucket buffers,
      // and backward's fp32 segments are rounded to bf16 through one bucket of fp32 staging.
      EXPECT_EQ(report.of(MemoryCategory::kBuckets), (2 + 1) * LargestBucket(plan) * 4);
      EXPECT_EQ(report.of(MemoryCategory::kCommScratch), StatisticsScratchBytes(plan, rank));
      // Optimizer state per rank is ddp's / W exactly (every rank owns padded_elems / W).
      const int64_t state = report.of(MemoryCategory::kOptimizerState);
      if (expected.mode == EngineMode::kDdp) {
        ddp_state_bytes = state;
      } else {
        EXPECT_EQ(state * world_size, ddp_state_bytes);
      }
    }
  }
}

TEST_P(EngineMemoryTest, ReducingInTheGradientDtypeNeedsNoBucketPoolOutsideZero2) {
  const int world_size = GetParam();
  const sharding::ShardPlan plan = MemoryPlan(world_size);
  for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
    SCOPED_TRACE(EngineModeName(mode));
    EngineConfig config = AdamBf16Config(mode);
    config.reduce_dtype = DType::kBFloat16;
    config.bucket_pool_size = 3;
    PlaceholderCommunicator communicator(0, world_size);
    auto engine = Engine::Create(plan, 0, config, &communicator);
    ASSERT_TRUE(engine.ok()) << engine.status();
    // Every mode stages backward's fp32 segments (one fp32 bucket); only zero2 keeps a pool.
    const int64_t staging = LargestBucket(plan) * 4;
    const int64_t expected_buckets =
        staging + (mode == EngineMode::kZero2 ? 3 * LargestBucket(plan) * 2 : 0);
    EXPECT_EQ((*engine)->Memory().of(MemoryCategory::kBuckets), expected_buckets);
  }
}

// fp32 parameters are their own master: 16 bytes per parameter in ddp (4 params + 4 grads + 8
// Adam state), as torch's DDP with Adam, and zero2 writes backward's segments straight into its
// two bucket buffers (no staging).
TEST_P(EngineMemoryTest, Fp32ParametersKeepNoMasterCopy) {
  const int world_size = GetParam();
  const sharding::ShardPlan plan = MemoryPlan(world_size);
  const double psi = static_cast<double>(plan.padded_elems());
  for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
    SCOPED_TRACE(EngineModeName(mode));
    EngineConfig config;
    config.mode = mode;
    config.optimizer.kind = kernels::OptimizerKind::kAdam;
    PlaceholderCommunicator communicator(0, world_size);
    auto engine = Engine::Create(plan, 0, config, &communicator);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const MemoryReport report = (*engine)->Memory();
    EXPECT_EQ(report.of(MemoryCategory::kMaster), 0);
    const double grads_per_param = mode == EngineMode::kZero2 ? 4.0 / world_size : 4.0;
    const double state_per_param = mode == EngineMode::kDdp ? 8.0 : 8.0 / world_size;
    EXPECT_EQ(report.of(MemoryCategory::kParams), psi * 4);
    EXPECT_EQ(report.of(MemoryCategory::kGrads), psi * grads_per_param);
    EXPECT_EQ(report.of(MemoryCategory::kOptimizerState), psi * state_per_param);
    EXPECT_EQ(report.of(MemoryCategory::kBuckets),
              mode == EngineMode::kZero2 ? 2 * LargestBucket(plan) * 4 : 0);
  }
}

// Buckets are fixed ranges of the flat space: zero2's pool is 2 x bucket_elems whatever the
// largest tensor (here 16x the bucket size).
TEST_P(EngineMemoryTest, TheBucketPoolDoesNotGrowWithTheLargestTensor) {
  const int world_size = GetParam();
  const sharding::ShardPlan plan = PlanOfSizes({1000, 16 * 65536, 5}, world_size);
  EngineConfig config;
  config.mode = EngineMode::kZero2;
  config.optimizer.kind = kernels::OptimizerKind::kAdam;
  PlaceholderCommunicator communicator(0, world_size);
  auto engine = Engine::Create(plan, 0, config, &communicator);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->Memory().of(MemoryCategory::kBuckets), 2 * 65536 * 4);
}

// bf16 parameters reach the workload as the engine stores them: Parameters() hands out the
// parameter copy itself (no fp32 view of the model), so asking for every tensor allocates
// nothing; ParametersOnHost widens one tensor at a time.
TEST_P(EngineMemoryTest, Bf16ParametersReachTheWorkloadWithoutAnFp32Copy) {
  const int world_size = GetParam();
  const sharding::ShardPlan plan = MemoryPlan(world_size);
  PlaceholderCommunicator communicator(0, world_size);
  auto engine = Engine::Create(plan, 0, AdamBf16Config(EngineMode::kZero2), &communicator);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Values that bf16 rounds (most need more than 8 significant bits).
  auto initial = [](int64_t tensor, int64_t k) {
    return 0.001f * static_cast<float>(k % 1000) + static_cast<float>(tensor);
  };
  ASSERT_TRUE((*engine)
                  ->InitializeParameters([&](int64_t tensor, absl::Span<float> out) {
                    for (size_t k = 0; k < out.size(); ++k) out[k] = initial(tensor, k);
                    return absl::OkStatus();
                  })
                  .ok());
  const MemoryReport before = (*engine)->Memory();
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    SCOPED_TRACE(absl::StrCat("tensor ", t));
    const absl::StatusOr<workloads::StoredParameters> asked = (*engine)->Parameters(t);
    ASSERT_TRUE(asked.ok()) << asked.status();
    const workloads::StoredParameters& stored = *asked;
    ASSERT_EQ(stored.dtype, DType::kBFloat16);
    ASSERT_EQ(stored.size, plan.placement(t).num_elements);
    std::vector<float> widened(stored.size);
    workloads::WidenParameters(stored, 0, stored.size, widened.data());
    int64_t rounded = 0;
    for (int64_t k = 0; k < stored.size; ++k) {
      const float expected = numerics::BFloat16ToFloat(numerics::FloatToBFloat16(initial(t, k)));
      ASSERT_EQ(widened[k], expected) << "element " << k;
      if (expected != initial(t, k)) ++rounded;
    }
    if (stored.size > 100) EXPECT_GT(rounded, 0);
    const absl::StatusOr<std::vector<float>> on_host = (*engine)->ParametersOnHost(t);
    ASSERT_TRUE(on_host.ok()) << on_host.status();
    EXPECT_EQ(*on_host, widened);
  }
  const MemoryReport after = (*engine)->Memory();
  EXPECT_EQ(after.total(), before.total()) << after.ToString();
  EXPECT_EQ(after.peak_total_bytes, before.peak_total_bytes) << after.ToString();
}

// The process's peak memory while InitializeParameters runs, above its memory before: what it
// stages on the host (the engine's own buffers are already resident).
absl::StatusOr<int64_t> InitializationPeakGrowth(Engine& engine) {
  ZS_RETURN_IF_ERROR(common::ResetPeakResidentMemory());
  ZS_ASSIGN_OR_RETURN(const common::ProcessMemory before, common::ReadProcessMemory());
  ZS_RETURN_IF_ERROR(engine.InitializeParameters([](int64_t tensor, absl::Span<float> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(tensor + i % 7);
    return absl::OkStatus();
  }));
  ZS_ASSIGN_OR_RETURN(const common::ProcessMemory after, common::ReadProcessMemory());
  return after.vmhwm_bytes - before.vmrss_bytes;
}

// fp32 parameters on the host are filled in place; bf16 ones stage one tensor in fp32 at a time
// and round it straight into the parameters. Either way no tensor-sized buffer is left as a peak
// that no category explains (a 32 MiB tensor here).
TEST(EngineInitializationMemoryTest, ParametersAreNotStagedWholeOnTheHost) {
  if (!common::RssFollowsAllocations()) GTEST_SKIP() << "RSS is the sanitizer's here";
  constexpr int64_t kMiB = 1024 * 1024;
  constexpr int64_t kLargest = 8 * kMiB;  // elements
  std::vector<sharding::TensorSpec> tensors;
  for (int64_t size : {int64_t{1000}, kLargest, int64_t{5}}) {
    sharding::TensorSpec spec;
    spec.name = absl::StrCat("t", tensors.size());
    spec.shape = {size};
    spec.num_elements = size;
    tensors.push_back(spec);
  }
  auto plan = sharding::ShardPlan::Create(tensors, 1, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  PlaceholderCommunicator communicator(0, 1);
  for (DType param_dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(numerics::DTypeName(param_dtype));
    EngineConfig config;
    config.mode = EngineMode::kDdp;
    config.optimizer.kind = kernels::OptimizerKind::kSgd;
    config.param_dtype = param_dtype;
    auto engine = Engine::Create(*plan, 0, config, &communicator);
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::StatusOr<int64_t> growth = InitializationPeakGrowth(**engine);
    if (absl::IsUnavailable(growth.status())) GTEST_SKIP() << growth.status();
    ASSERT_TRUE(growth.ok()) << growth.status();
    const int64_t staged = param_dtype == DType::kFloat32 ? 0 : kLargest * 4;
    EXPECT_LE(*growth, staged + 2 * kMiB);
    // The values arrived.
    absl::StatusOr<std::vector<float>> values = (*engine)->ParametersOnHost(1);
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_EQ((*values)[kLargest - 1], static_cast<float>(1 + (kLargest - 1) % 7));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EngineMemoryTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("W", info.param);
                         });

}  // namespace
}  // namespace zeroshard::engine
