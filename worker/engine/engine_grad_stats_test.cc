// The engine's gradient statistics ride on the bucket moves (during backward once a reduction is
// done), with the bits of one ComputeGradStats pass over the owned fragments, in every mode.
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_optimizer.h"
#include "numerics/dtype.h"
#include "sharding/shard_planner.h"
#include "sharding/test_plans.h"
#include "worker/comm/communicator.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/element_convert.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;

// HostDeviceOps that counts the moves with statistics and the whole-piece statistics passes.
// Thread contract: as DeviceOps.
class CountingDevice final : public DeviceOps {
 public:
  void* AllocateZeroed(int64_t bytes) override { return host_.AllocateZeroed(bytes); }
  void Free(void* data) override { host_.Free(data); }
  const char* name() const override { return host_.name(); }
  bool host_memory() const override { return host_.host_memory(); }
  absl::Status CopyFromHost(void* dst, const void* host_src, int64_t bytes) override {
    return host_.CopyFromHost(dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* src, int64_t bytes) override {
    return host_.CopyToHost(host_dst, src, bytes);
  }
  absl::Status StoreScaledGradient(const float* grad, float scale, int64_t count,
                                   DType storage_dtype, void* dst, DType dst_dtype) override {
    return host_.StoreScaledGradient(grad, scale, count, storage_dtype, dst, dst_dtype);
  }
  absl::Status ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                               int64_t count) override {
    return host_.ConvertElements(src, src_dtype, dst, dst_dtype, count);
  }
  absl::Status ZeroElements(void* dst, DType dtype, int64_t count) override {
    return host_.ZeroElements(dst, dtype, count);
  }
  absl::Status ApplyUpdate(const kernels::OptimizerConfig& config, int64_t step, float grad_scale,
                           absl::Span<const kernels::UpdatePiece> pieces) override {
    return host_.ApplyUpdate(config, step, grad_scale, pieces);
  }
  absl::StatusOr<kernels::GradStats> ComputeGradStats(
      absl::Span<const kernels::GradPiece> pieces) override {
    ++whole_piece_passes_;
    return host_.ComputeGradStats(pieces);
  }
  int64_t GradStatsChunkElements() const override { return host_.GradStatsChunkElements(); }
  absl::Status ConvertWithGradStats(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                                    const kernels::GradStatsChunk* chunks, int64_t num_chunks,
                                    double* partials) override {
    ++moves_with_stats_;
    return host_.ConvertWithGradStats(src, src_dtype, dst, dst_dtype, chunks, num_chunks, partials);
  }
  absl::Status CombineGradStats(const double* partials, int64_t count, double* result) override {
    return host_.CombineGradStats(partials, count, result);
  }
  absl::Status Synchronize() override { return host_.Synchronize(); }

  int64_t moves_with_stats() const { return moves_with_stats_; }
  int64_t whole_piece_passes() const { return whole_piece_passes_; }

 private:
  HostDeviceOps host_{/*threads=*/2};
  int64_t moves_with_stats_ = 0;
  int64_t whole_piece_passes_ = 0;
};

// A collective at W = 1 (the buffer already holds the result) that is done only once the host
// has waited for it, as a slow reduction would be when the engine first looks.
class DoneWhenWaited : public comm::Work {
 public:
  absl::Status Wait(absl::Duration /*timeout*/) override {
    done_ = true;
    return absl::OkStatus();
  }
  bool Done() const override { return done_; }

 private:
  bool done_ = false;
};

// One rank whose reductions are never done before the engine waits for them, so buckets retire
// only when they must (a full bucket pool, or Step()). Thread contract: as IdentityCommunicator.
class SlowReductions : public comm::testing::IdentityCommunicator {
 public:
  std::unique_ptr<comm::Work> ReduceScatterInPlace(void*, size_t, comm::ElementType, comm::ReduceOp,
                                                   const comm::CollectiveOptions&) override {
    return std::make_unique<DoneWhenWaited>();
  }
  std::unique_ptr<comm::Work> AllReduce(void*, size_t, comm::ElementType, comm::ReduceOp,
                                        const comm::CollectiveOptions&) override {
    return std::make_unique<DoneWhenWaited>();
  }
};

// Tensors in buckets of about 100k elements: fragments longer than a statistics chunk (64Ki on
// the CPU), fragments of a few elements, and more buckets than the pool holds.
sharding::ShardPlan StatsPlan() {
  auto plan = sharding::PlanOfSizes({70000, 1000, 150001, 33, 5000, 120007}, /*world_size=*/1,
                                    /*bucket_elems=*/100000);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// Element i of tensor t's gradient at `step`: magnitudes from 1e-4 to about 30 (fp16 keeps
// them finite), signs mixed; `poison` puts a NaN at element 5 of tensor 1 instead.
float GradientValue(int64_t t, int64_t i, int64_t step) {
  const int64_t k = (i * 7 + t * 13 + step * 5) % 101;
  return static_cast<float>((k - 50) * (k % 3 == 0 ? 0.6 : 1e-4) * (1.0 + 0.001 * t));
}

std::vector<float> Gradient(const sharding::ShardPlan& plan, int64_t t, int64_t step, bool poison) {
  std::vector<float> values(plan.placement(t).num_elements);
  for (size_t i = 0; i < values.size(); ++i) values[i] = GradientValue(t, i, step);
  if (poison && t == 1) values[5] = NAN;
  return values;
}

struct Precision {
  const char* name;
  DType grads;
  DType reduce;
};

const Precision kPrecisions[] = {
    {"fp32 reduced in fp32", DType::kFloat32, DType::kFloat32},
    {"bf16 reduced in fp32", DType::kBFloat16, DType::kFloat32},
    {"fp16 reduced in fp16", DType::kFloat16, DType::kFloat16},
    {"fp32 reduced in bf16", DType::kFloat32, DType::kBFloat16},
};

// The norm the old separate pass gave: ComputeGradStats over the owned fragments of the
// gradients as stored (rounded to grad_dtype, through reduce_dtype and back: W = 1 sums nothing).
double ReferenceNorm(const sharding::ShardPlan& plan, const Precision& precision, int64_t step) {
  const absl::StatusOr<sharding::RankView> view = plan.ViewForRank(0);
  EXPECT_TRUE(view.ok());
  const int grad_size = numerics::DTypeSize(precision.grads);
  std::vector<std::vector<char>> stored(plan.num_tensors());
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    const std::vector<float> gradient = Gradient(plan, t, step, /*poison=*/false);
    const int64_t n = static_cast<int64_t>(gradient.size());
    std::vector<char> reduced(n * numerics::DTypeSize(precision.reduce));
    stored[t].resize(n * grad_size);
    StoreScaledGradient(gradient.data(), 1.0f, n, precision.grads, reduced.data(),
                        precision.reduce);
    ConvertElements(reduced.data(), precision.reduce, stored[t].data(), precision.grads, n);
  }
  std::vector<kernels::GradPiece> pieces;
  for (const sharding::TensorFragment& fragment : view->fragments()) {
    pieces.push_back(
        kernels::GradPiece{stored[fragment.tensor].data() + fragment.tensor_begin * grad_size,
                           precision.grads, fragment.size()});
  }
  const absl::StatusOr<kernels::GradStats> stats = kernels::ComputeGradStatsCpu(pieces, nullptr);
  EXPECT_TRUE(stats.ok());
  return std::sqrt(stats->sum_squares);
}

struct StepRun {
  StepResult result;
  int64_t moves_before_step = 0;  // moves with statistics while the gradients were handed over
  int64_t moves_in_step = 0;
  int64_t whole_piece_passes = 0;
};

// Runs `steps` steps of one engine; the last step's gradients are poisoned when asked.
std::vector<StepRun> Train(const sharding::ShardPlan& plan, EngineMode mode,
                           const Precision& precision, comm::Communicator* communicator, int steps,
                           int poisoned_step = -1) {
  CountingDevice device;
  EngineConfig config;
  config.mode = mode;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.01;
  config.grad_dtype = precision.grads;
  config.reduce_dtype = precision.reduce;
  config.device = &device;
  auto engine = Engine::Create(plan, /*rank=*/0, config, communicator);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  EXPECT_TRUE((*engine)
                  ->InitializeParameters([](int64_t, absl::Span<float> out) {
                    for (float& value : out) value = 0.5f;
                    return absl::OkStatus();
                  })
                  .ok());
  std::vector<StepRun> runs;
  for (int step = 0; step < steps; ++step) {
    StepRun run;
    const int64_t moves_at_start = device.moves_with_stats();
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      const std::vector<float> gradient = Gradient(plan, t, step, step == poisoned_step);
      EXPECT_TRUE(workloads::CopyGradientToSink(**engine, t, gradient).ok());
    }
    run.moves_before_step = device.moves_with_stats() - moves_at_start;
    absl::StatusOr<StepResult> result = (*engine)->Step(/*local_loss=*/1.0);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return runs;
    run.result = *result;
    run.moves_in_step = device.moves_with_stats() - moves_at_start - run.moves_before_step;
    run.whole_piece_passes = device.whole_piece_passes();
    runs.push_back(run);
  }
  return runs;
}

TEST(EngineGradStatsTest, TheNormRidesOnTheMovesWithTheBitsOfOneSeparatePass) {
  const sharding::ShardPlan plan = StatsPlan();
  ASSERT_GT(plan.num_buckets(), 2);
  constexpr int kSteps = 2;
  for (const Precision& precision : kPrecisions) {
    for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
      SCOPED_TRACE(absl::StrCat(precision.name, ", ", EngineModeName(mode)));
      comm::testing::IdentityCommunicator at_once;
      SlowReductions slow;
      const std::vector<StepRun> fast_runs = Train(plan, mode, precision, &at_once, kSteps);
      const std::vector<StepRun> slow_runs = Train(plan, mode, precision, &slow, kSteps);
      ASSERT_EQ(fast_runs.size(), kSteps);
      ASSERT_EQ(slow_runs.size(), kSteps);
      for (int step = 0; step < kSteps; ++step) {
        const double expected = ReferenceNorm(plan, precision, step);
        ASSERT_TRUE(std::isfinite(expected));
        // Reductions done at once: every bucket retired, statistics summed, during backward.
        EXPECT_EQ(fast_runs[step].moves_before_step, plan.num_buckets()) << "step " << step;
        EXPECT_EQ(fast_runs[step].moves_in_step, 0) << "step " << step;
        // Reductions done only when waited for: the buckets still in flight retire in Step().
        EXPECT_EQ(slow_runs[step].moves_before_step + slow_runs[step].moves_in_step,
                  plan.num_buckets())
            << "step " << step;
        EXPECT_GT(slow_runs[step].moves_in_step, 0) << "step " << step;
        // The same bits as the separate pass, whenever the buckets retired.
        EXPECT_EQ(fast_runs[step].result.grad_norm, expected) << "step " << step;
        EXPECT_EQ(slow_runs[step].result.grad_norm, expected) << "step " << step;
        EXPECT_FALSE(fast_runs[step].result.skipped);
        EXPECT_EQ(fast_runs[step].whole_piece_passes, 0);
        EXPECT_EQ(slow_runs[step].whole_piece_passes, 0);
      }
    }
  }
}

TEST(EngineGradStatsTest, ANonFiniteGradientSkipsItsStepOnly) {
  const sharding::ShardPlan plan = StatsPlan();
  for (const Precision& precision : kPrecisions) {
    for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
      SCOPED_TRACE(absl::StrCat(precision.name, ", ", EngineModeName(mode)));
      comm::testing::IdentityCommunicator at_once;
      const std::vector<StepRun> runs =
          Train(plan, mode, precision, &at_once, /*steps=*/3, /*poisoned_step=*/1);
      ASSERT_EQ(runs.size(), 3u);
      EXPECT_FALSE(runs[0].result.skipped);
      EXPECT_TRUE(runs[1].result.skipped);
      EXPECT_FALSE(std::isfinite(runs[1].result.grad_norm));
      EXPECT_EQ(runs[1].result.optimizer_step, 1);
      // The next step's statistics are its own: the poisoned partial was rewritten.
      EXPECT_FALSE(runs[2].result.skipped);
      EXPECT_EQ(runs[2].result.grad_norm, ReferenceNorm(plan, precision, 2));
      EXPECT_EQ(runs[2].result.optimizer_step, 2);
    }
  }
}

}  // namespace
}  // namespace zeroshard::engine
