// The zero2 hand-over an attached trainer drives: TryGradBuffer refuses, without waiting, a
// segment whose bucket has no free buffer until a reduction frees one; EndMicroBatch reduces each
// micro-batch into the owned gradient pieces and Step() applies their sum.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "sharding/test_plans.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

// A W = 1 bucket reduction (the buffer already holds the sum) that is not done until the test
// releases it; waiting for it before then is a test failure (the engine must not wait).
// Thread contract: the engine's owner thread calls it; the flag is an atomic the test sets.
class HeldReduction : public comm::Work {
 public:
  explicit HeldReduction(const std::atomic<bool>* released) : released_(released) {}

  absl::Status Wait(absl::Duration /*timeout*/) override { return WaitOnComputeStream(); }
  absl::Status WaitOnComputeStream() override {
    EXPECT_TRUE(released_->load()) << "the engine waited for a held reduction";
    return absl::OkStatus();
  }
  bool Done() const override { return released_->load(); }
  std::optional<absl::Duration> RunTime() const override { return absl::ZeroDuration(); }

 private:
  const std::atomic<bool>* const released_;
};

// One rank whose reduction i is held until Release(i). Thread contract: one thread (the test's,
// which is the engine's owner).
class HoldingCommunicator : public comm::testing::IdentityCommunicator {
 public:
  explicit HoldingCommunicator(int reductions) : released_(reductions) {
    for (std::atomic<bool>& released : released_) released = false;
  }

  void Release(int reduction) { released_[reduction] = true; }
  int launched() const { return launched_; }

  std::unique_ptr<comm::Work> ReduceScatterInPlace(void*, size_t, comm::ElementType, comm::ReduceOp,
                                                   const comm::CollectiveOptions&) override {
    return std::make_unique<HeldReduction>(&released_[launched_++]);
  }

 private:
  std::vector<std::atomic<bool>> released_;
  int launched_ = 0;
};

constexpr int64_t kTensorElems = 1000;

TEST(EngineMicroBatchTest, TryGradBufferRefusesUntilTheReductionFreesTheOnlyBuffer) {
  // Two tensors in buckets of kMinBucketElems: one bucket each, one buffer for both.
  auto plan = sharding::PlanOfSizes({kTensorElems, kTensorElems}, /*world_size=*/1,
                                    sharding::kMinBucketElems);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->num_buckets(), 2);
  HoldingCommunicator communicator(/*reductions=*/2);
  EngineConfig config;
  config.mode = EngineMode::kZero2;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.5;
  config.bucket_pool_size = 1;
  auto engine = Engine::Create(*plan, /*rank=*/0, config, &communicator);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)
                  ->InitializeParameters([](int64_t, absl::Span<float> out) {
                    for (float& value : out) value = 1.0f;
                    return absl::OkStatus();
                  })
                  .ok());
  const float gradients[2] = {0.25f, 0.5f};

  absl::StatusOr<std::optional<absl::Span<float>>> first =
      (*engine)->TryGradBuffer(0, 0, kTensorElems);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value()) << "the free buffer was refused";
  for (float& value : **first) value = gradients[0];
  ASSERT_TRUE((*engine)->GradWritten(0, 0, kTensorElems).ok());
  ASSERT_EQ(communicator.launched(), 1);

  // Bucket 0's reduce-scatter holds the only buffer: refused, as often as asked, without waiting.
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<std::optional<absl::Span<float>>> refused =
        (*engine)->TryGradBuffer(1, 0, kTensorElems);
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_FALSE(refused->has_value()) << "attempt " << attempt;
  }
  // A refusal leaves no segment open: Step() still wants tensor 1.
  EXPECT_EQ((*engine)->Step(0.0).status().code(), absl::StatusCode::kFailedPrecondition);

  communicator.Release(0);
  absl::StatusOr<std::optional<absl::Span<float>>> placed =
      (*engine)->TryGradBuffer(1, 0, kTensorElems);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_TRUE(placed->has_value()) << "the freed buffer was refused";
  for (float& value : **placed) value = gradients[1];
  ASSERT_TRUE((*engine)->GradWritten(1, 0, kTensorElems).ok());
  communicator.Release(1);

  absl::StatusOr<StepResult> result = (*engine)->Step(0.0);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int64_t t = 0; t < 2; ++t) {
    absl::StatusOr<std::vector<float>> params = (*engine)->ParametersOnHost(t);
    ASSERT_TRUE(params.ok()) << params.status();
    for (float value : *params) ASSERT_EQ(value, 1.0f - 0.5f * gradients[t]) << "tensor " << t;
  }
}

// Odd sizes so tensors straddle buckets and pieces; more buckets than the pool holds.
const std::vector<int64_t>& Sizes() {
  static const std::vector<int64_t>* sizes = new std::vector<int64_t>{300, 7, 1000, 65, 2000, 513};
  return *sizes;
}

// Multiples of 1/8 in [-1, 1): every sum of a few of them is exact in fp32, so reducing each
// micro-batch and adding gives the bits of reducing their sum once.
float MicroBatchGradient(int64_t step, int micro, int rank, int64_t tensor, int64_t element) {
  return static_cast<float>((element + 3 * tensor + 5 * micro + 7 * rank + step) % 16) * 0.125f -
         1.0f;
}

constexpr int kMicroBatches = 3;
constexpr int64_t kSteps = 3;

// Trains kSteps steps of kMicroBatches micro-batches in zero2 at W = 2 and returns rank 0's
// parameters, every tensor concatenated, and its grad norms. `accumulate`: each micro-batch is
// handed over and ended with EndMicroBatch() (the last step's last one without it, so that both
// ways into Step() are used); otherwise the trainer sums the micro-batches and hands the sum over.
struct Trained {
  std::vector<float> params;
  std::vector<double> grad_norms;
};
Trained Train(bool accumulate) {
  auto plan = sharding::PlanOfSizes(Sizes(), /*world_size=*/2, sharding::kMinBucketElems);
  EXPECT_TRUE(plan.ok()) << plan.status();
  comm::InMemoryStore store;
  Trained trained;
  const absl::Status status = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = 2;
    options.store = &store;
    options.rendezvous_timeout = absl::Seconds(30);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                        comm::GlooCommunicator::Create(options));
    EngineConfig config;
    config.mode = EngineMode::kZero2;
    config.optimizer.kind = kernels::OptimizerKind::kAdamW;
    config.optimizer.lr = 0.01;
    config.clip_grad_norm = 5.0;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(*plan, rank, config, communicator.get()));
    ZS_RETURN_IF_ERROR(engine->InitializeParameters([](int64_t t, absl::Span<float> out) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = 0.01f * static_cast<float>((i + t) % 7);
      return absl::OkStatus();
    }));
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> sums(Sizes().size());
      for (int micro = 0; micro < kMicroBatches; ++micro) {
        for (int64_t t = 0; t < static_cast<int64_t>(Sizes().size()); ++t) {
          std::vector<float> gradient(Sizes()[t]);
          for (int64_t i = 0; i < Sizes()[t]; ++i) {
            gradient[i] = MicroBatchGradient(step, micro, rank, t, i);
          }
          if (accumulate) {
            ZS_RETURN_IF_ERROR(workloads::CopyGradientToSink(*engine, t, gradient));
            continue;
          }
          sums[t].resize(gradient.size(), 0.0f);
          for (size_t i = 0; i < gradient.size(); ++i) sums[t][i] += gradient[i];
        }
        const bool last = step == kSteps - 1 && micro == kMicroBatches - 1;
        if (accumulate && !last) ZS_RETURN_IF_ERROR(engine->EndMicroBatch());
      }
      if (!accumulate) {
        for (int64_t t = 0; t < static_cast<int64_t>(sums.size()); ++t) {
          ZS_RETURN_IF_ERROR(workloads::CopyGradientToSink(*engine, t, sums[t]));
        }
      }
      ZS_ASSIGN_OR_RETURN(const StepResult result, engine->Step(0.0));
      if (rank == 0) trained.grad_norms.push_back(result.grad_norm);
    }
    for (int64_t t = 0; t < plan->num_tensors(); ++t) {
      ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
      if (rank == 0) trained.params.insert(trained.params.end(), values.begin(), values.end());
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return trained;
}

TEST(EngineMicroBatchTest, ReducingEachMicroBatchEqualsReducingTheirSum) {
  const Trained accumulated = Train(/*accumulate=*/true);
  const Trained summed = Train(/*accumulate=*/false);
  ASSERT_EQ(accumulated.grad_norms.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(accumulated.grad_norms, summed.grad_norms);
  ASSERT_EQ(accumulated.params.size(), summed.params.size());
  ASSERT_FALSE(accumulated.params.empty());
  for (size_t i = 0; i < summed.params.size(); ++i) {
    ASSERT_EQ(accumulated.params[i], summed.params[i]) << "element " << i;
  }
}

TEST(EngineMicroBatchTest, EndMicroBatchNeedsZero2AndEveryTensor) {
  auto plan = sharding::PlanOfSizes(Sizes(), /*world_size=*/1, sharding::kMinBucketElems);
  ASSERT_TRUE(plan.ok()) << plan.status();
  comm::testing::IdentityCommunicator communicator;
  for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
    SCOPED_TRACE(EngineModeName(mode));
    EngineConfig config;
    config.mode = mode;
    config.optimizer.kind = kernels::OptimizerKind::kSgd;
    config.optimizer.lr = 0.1;
    auto engine = Engine::Create(*plan, /*rank=*/0, config, &communicator);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)
                    ->InitializeParameters([](int64_t, absl::Span<float> out) {
                      for (float& value : out) value = 0.0f;
                      return absl::OkStatus();
                    })
                    .ok());
    const std::vector<float> gradient(Sizes()[0], 1.0f);
    ASSERT_TRUE(workloads::CopyGradientToSink(**engine, 0, gradient).ok());
    // One tensor of six handed over.
    EXPECT_EQ((*engine)->EndMicroBatch().code(), absl::StatusCode::kFailedPrecondition);
    for (int64_t t = 1; t < plan->num_tensors(); ++t) {
      ASSERT_TRUE(
          workloads::CopyGradientToSink(**engine, t, std::vector<float>(Sizes()[t], 1.0f)).ok());
    }
    const absl::Status ended = (*engine)->EndMicroBatch();
    if (mode != EngineMode::kZero2) {
      EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition) << ended;
      continue;
    }
    ASSERT_TRUE(ended.ok()) << ended;
    // Between micro-batches the step is in progress: no checkpoint of a half-accumulated step.
    std::vector<char> staging((*engine)->SavedBytes());
    EXPECT_EQ((*engine)->CopyStateTo(absl::MakeSpan(staging)).status().code(),
              absl::StatusCode::kFailedPrecondition);
    // A micro-batch begun must be completed before the step.
    ASSERT_TRUE(workloads::CopyGradientToSink(**engine, 0, gradient).ok());
    EXPECT_EQ((*engine)->Step(0.0).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace zeroshard::engine
