// torch.optim's semantics that an attached trainer asks of the engine (issue 26): tensors without
// a gradient are skipped and count their own steps, ddp's gradients averaged in place before the
// step (as torch's DDP leaves .grad), and opt.clip_grad_norm_'s global norm across shards.
// Threads as ranks over Gloo (TCP loopback); each rank writes known gradients, so the expected
// values follow from torch.optim's formulas. Every test fails on the engine before issue 26,
// which had none of these calls (and updated every tensor in every step).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/engine.h"

namespace zeroshard::engine {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

// Odd sizes spread over several buckets, so every rank owns pieces of several tensors.
std::vector<sharding::TensorSpec> Tensors() {
  std::vector<sharding::TensorSpec> tensors;
  for (const int64_t elements : {700, 33, 1500, 5}) {
    sharding::TensorSpec spec;
    spec.name = absl::StrCat("t", tensors.size());
    spec.shape = {elements};
    spec.num_elements = elements;
    tensors.push_back(spec);
  }
  return tensors;
}

sharding::ShardPlan Plan(int64_t world_size) {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  auto plan = sharding::ShardPlan::Create(Tensors(), world_size, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// Rank r's gradient of element i of tensor t in step s: distinct everywhere, some negative.
float Gradient(int rank, int64_t step, int64_t t, int64_t i) {
  return 0.01f * static_cast<float>((rank + 1) * (t + 2)) *
         static_cast<float>(static_cast<int64_t>((i * 7 + step * 3) % 11) - 4);
}

float Initial(int64_t t, int64_t i) { return 0.1f * static_cast<float>(t + 1) + 0.001f * i; }

// One rank's step: which tensors this rank has a gradient for (the others are handed over as
// zeros and named to SetTensorsWithoutGradient), then what runs between the hand-over and Step().
struct RankStep {
  std::function<bool(int rank, int64_t t)> has_gradient = [](int, int64_t) { return true; };
  std::function<absl::Status(Engine& engine, int rank)> before_step = [](Engine&, int) {
    return absl::OkStatus();
  };
};

struct RunResult {
  std::vector<std::vector<float>> params;  // rank 0's, per tensor
  std::vector<int64_t> tensor_steps;       // rank 0's
  std::vector<StepResult> steps;           // rank 0's
  Engine::SavedScalars scalars;            // rank 0's after the last step
};

RunResult RunRanks(int world_size, const EngineConfig& config, int64_t steps,
                   const std::function<RankStep(int64_t step)>& step_of) {
  const sharding::ShardPlan plan = Plan(world_size);
  comm::InMemoryStore store;
  RunResult result;
  const absl::Status status = RunOnRankThreads(world_size, [&](int rank) -> absl::Status {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.store = &store;
    options.rendezvous_timeout = absl::Seconds(30);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                        comm::GlooCommunicator::Create(options));
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(plan, rank, config, communicator.get()));
    ZS_RETURN_IF_ERROR(engine->InitializeParameters([](int64_t t, absl::Span<float> out) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = Initial(t, static_cast<int64_t>(i));
      return absl::OkStatus();
    }));
    for (int64_t step = 0; step < steps; ++step) {
      const RankStep rank_step = step_of(step);
      std::vector<int64_t> without;
      for (int64_t t = 0; t < plan.num_tensors(); ++t) {
        const bool has = rank_step.has_gradient(rank, t);
        if (!has) without.push_back(t);
        ZS_RETURN_IF_ERROR(workloads::ForEachGradSegment(
            *engine, t, plan.tensors()[t].num_elements,
            [&](int64_t begin, int64_t, absl::Span<float> out) {
              for (size_t i = 0; i < out.size(); ++i) {
                out[i] = has ? Gradient(rank, step, t, begin + static_cast<int64_t>(i)) : 0.0f;
              }
              return absl::OkStatus();
            }));
      }
      ZS_RETURN_IF_ERROR(engine->SetTensorsWithoutGradient(without));
      ZS_RETURN_IF_ERROR(rank_step.before_step(*engine, rank));
      ZS_ASSIGN_OR_RETURN(const StepResult stepped, engine->Step(0.0));
      if (rank == 0) result.steps.push_back(stepped);
    }
    if (rank != 0) return absl::OkStatus();
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      ZS_ASSIGN_OR_RETURN(std::vector<float> values, engine->ParametersOnHost(t));
      result.params.push_back(std::move(values));
      result.tensor_steps.push_back(engine->tensor_step(t));
    }
    result.scalars = engine->scalars();
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

EngineConfig AdamConfig(EngineMode mode) {
  EngineConfig config;
  config.mode = mode;
  config.optimizer.kind = kernels::OptimizerKind::kAdam;
  config.optimizer.lr = 0.01;
  config.optimizer.beta1 = 0.8;
  config.optimizer.beta2 = 0.9;
  return config;
}

// torch.optim.Adam on one element, in float in torch's order, for the steps it is given a
// gradient (nullopt: skipped, as torch skips a parameter whose .grad is None).
float TorchAdam(float param, const std::vector<std::optional<float>>& gradients, double lr,
                double beta1, double beta2, double eps) {
  float exp_avg = 0.0f;
  float exp_avg_sq = 0.0f;
  int64_t step = 0;
  for (const std::optional<float>& gradient : gradients) {
    if (!gradient.has_value()) continue;
    ++step;
    const float g = *gradient;
    exp_avg = exp_avg * static_cast<float>(beta1) + static_cast<float>(1.0 - beta1) * g;
    exp_avg_sq = exp_avg_sq * static_cast<float>(beta2) + static_cast<float>(1.0 - beta2) * g * g;
    const double correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    const float denom = std::sqrt(exp_avg_sq) / static_cast<float>(std::sqrt(correction2)) +
                        static_cast<float>(eps);
    param = param + static_cast<float>(-(lr / correction1)) * exp_avg / denom;
  }
  return param;
}

class TorchSemanticsTest : public ::testing::TestWithParam<EngineMode> {};

// Tensor 1 has no gradient on any rank in steps 1 and 2: it is not updated there and counts 2 of
// the 4 steps; tensor 2 lacks one only on rank 0 in step 1: the ranks' sets are OR-ed, so it is
// updated with the mean of rank 1's gradient and zero, as DDP averages an unused parameter.
TEST_P(TorchSemanticsTest, TensorsNoRankHasAGradientForAreSkippedAndCountTheirOwnSteps) {
  constexpr int kWorld = 2;
  const EngineConfig config = AdamConfig(GetParam());
  auto has_gradient = [](int64_t step, int rank, int64_t t) {
    if (t == 1 && (step == 1 || step == 2)) return false;
    if (t == 2 && step == 1 && rank == 0) return false;
    return true;
  };
  const RunResult run = RunRanks(kWorld, config, 4, [&](int64_t step) {
    RankStep rank_step;
    rank_step.has_gradient = [=](int rank, int64_t t) { return has_gradient(step, rank, t); };
    return rank_step;
  });
  ASSERT_EQ(run.params.size(), 4u);
  EXPECT_EQ(run.steps.back().optimizer_step, 4);
  EXPECT_EQ(run.tensor_steps, (std::vector<int64_t>{4, 2, 4, 4}));
  EXPECT_EQ(run.scalars.tensor_steps, (std::vector<int64_t>{4, 2, 4, 4}));
  const std::vector<sharding::TensorSpec> tensors = Tensors();
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < tensors[t].num_elements; ++i) {
      std::vector<std::optional<float>> gradients;
      for (int64_t step = 0; step < 4; ++step) {
        float sum = 0.0f;
        bool any = false;
        for (int rank = 0; rank < kWorld; ++rank) {
          if (!has_gradient(step, rank, t)) continue;
          any = true;
          sum += Gradient(rank, step, t, i);
        }
        gradients.push_back(any ? std::optional<float>(sum * 0.5f) : std::nullopt);
      }
      const float expected = TorchAdam(Initial(t, i), gradients, 0.01, 0.8, 0.9, 1e-8);
      ASSERT_NEAR(run.params[t][i], expected, 1e-6f * std::max(1.0f, std::fabs(expected)))
          << "tensor " << t << " element " << i;
    }
  }
}

// torch.optim does nothing in a step() without gradients: no parameter moves, no step counts.
TEST_P(TorchSemanticsTest, AStepWithoutAnyGradientChangesNothing) {
  const EngineConfig config = AdamConfig(GetParam());
  const RunResult two = RunRanks(2, config, 2, [](int64_t) { return RankStep(); });
  const RunResult three = RunRanks(2, config, 3, [](int64_t step) {
    RankStep rank_step;
    if (step == 2) rank_step.has_gradient = [](int, int64_t) { return false; };
    return rank_step;
  });
  EXPECT_EQ(three.params, two.params);  // bitwise
  EXPECT_EQ(three.tensor_steps, (std::vector<int64_t>{2, 2, 2, 2}));
}

// opt.clip_grad_norm_ as FSDP's: the norm of the averaged gradient over every rank's shard, L2 or
// the largest |element|, and the step applies the clipped gradient (SGD, lr 1: the update is the
// gradient itself).
TEST_P(TorchSemanticsTest, ClipGradNormIsGlobalAcrossShards) {
  constexpr int kWorld = 2;
  const std::vector<sharding::TensorSpec> tensors = Tensors();
  double sum_squares = 0.0;
  double largest = 0.0;
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < tensors[t].num_elements; ++i) {
      const double mean = (Gradient(0, 0, t, i) + Gradient(1, 0, t, i)) * 0.5f;
      sum_squares += mean * mean;
      largest = std::max(largest, std::fabs(mean));
    }
  }
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(absl::StrCat("norm_type ", norm_type));
    const double expected_norm = norm_type == 2.0 ? std::sqrt(sum_squares) : largest;
    const double max_norm = expected_norm / 4;
    EngineConfig config;
    config.mode = GetParam();
    config.optimizer.kind = kernels::OptimizerKind::kSgd;
    config.optimizer.lr = 1.0;
    std::vector<double> norms(kWorld, 0.0);
    const RunResult run = RunRanks(kWorld, config, 1, [&](int64_t) {
      RankStep rank_step;
      rank_step.before_step = [&](Engine& engine, int rank) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(norms[rank], engine.ClipGradNorm(max_norm, norm_type));
        return absl::OkStatus();
      };
      return rank_step;
    });
    for (const double norm : norms) EXPECT_NEAR(norm, expected_norm, 1e-6 * expected_norm);
    const double coefficient = max_norm / (expected_norm + 1e-6);
    EXPECT_NEAR(run.steps[0].clip_coef, coefficient, 1e-9);
    for (int64_t t = 0; t < 4; ++t) {
      for (int64_t i = 0; i < tensors[t].num_elements; ++i) {
        const double mean = (Gradient(0, 0, t, i) + Gradient(1, 0, t, i)) * 0.5f;
        ASSERT_NEAR(run.params[t][i], Initial(t, i) - coefficient * mean, 1e-6)
            << "tensor " << t << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, TorchSemanticsTest,
                         ::testing::Values(EngineMode::kDdp, EngineMode::kZero1,
                                           EngineMode::kZero2),
                         [](const ::testing::TestParamInfo<EngineMode>& info) {
                           return std::string(EngineModeName(info.param));
                         });

// ddp: after AverageGradients the full gradient buffer holds the mean over ranks (what torch's
// DDP leaves in .grad), and the answer names the tensors no rank has a gradient for (tensor 3;
// tensor 2 lacks one on rank 1 only: its mean is rank 0's halved, as DDP averages). The trainer
// halves the buffer (as its own clipping would), and Step() applies it as changed, reporting its
// norm (SGD, lr 1).
TEST(AverageGradientsTest, TheBufferHoldsTheMeanAndStepAppliesItAsChanged) {
  constexpr int kWorld = 2;
  EngineConfig config;
  config.mode = EngineMode::kDdp;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 1.0;
  const std::vector<sharding::TensorSpec> tensors = Tensors();
  auto has_gradient = [](int rank, int64_t t) { return t != 3 && !(t == 2 && rank == 1); };
  auto mean = [&](int64_t t, int64_t i) {
    float sum = 0.0f;
    for (int rank = 0; rank < kWorld; ++rank) {
      if (has_gradient(rank, t)) sum += Gradient(rank, 0, t, i);
    }
    return sum * 0.5f;
  };
  std::vector<bool> averaged_ok(kWorld, false);
  std::vector<std::vector<int64_t>> without(kWorld);
  const RunResult run = RunRanks(kWorld, config, 1, [&](int64_t) {
    RankStep rank_step;
    rank_step.has_gradient = has_gradient;
    rank_step.before_step = [&](Engine& engine, int rank) -> absl::Status {
      ZS_ASSIGN_OR_RETURN(without[rank], engine.AverageGradients());
      bool all = true;
      for (int64_t t = 0; t < 4; ++t) {
        ZS_ASSIGN_OR_RETURN(float* gradient, engine.FullGradient(t));
        for (int64_t i = 0; i < tensors[t].num_elements; ++i) {
          all = all && gradient[i] == mean(t, i);
          gradient[i] *= 0.5f;
        }
      }
      averaged_ok[rank] = all;
      // Twice in one step is refused.
      if (engine.AverageGradients().status().code() != absl::StatusCode::kFailedPrecondition) {
        return absl::InternalError("a second AverageGradients was accepted");
      }
      return absl::OkStatus();
    };
    return rank_step;
  });
  EXPECT_EQ(averaged_ok, std::vector<bool>(kWorld, true));
  EXPECT_EQ(without, std::vector<std::vector<int64_t>>(kWorld, std::vector<int64_t>{3}));
  EXPECT_EQ(run.tensor_steps, (std::vector<int64_t>{1, 1, 1, 0}));
  double sum_squares = 0.0;
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < tensors[t].num_elements; ++i) {
      const float halved = mean(t, i) * 0.5f;
      sum_squares += static_cast<double>(halved) * halved;
      ASSERT_EQ(run.params[t][i], Initial(t, i) + -1.0f * halved) << "tensor " << t;
    }
  }
  EXPECT_NEAR(run.steps[0].grad_norm, std::sqrt(sum_squares), 1e-9);
}

TEST(AverageGradientsTest, RefusedOutsideDdpAndBadClipArguments) {
  const sharding::ShardPlan plan = Plan(1);
  comm::InMemoryStore store;
  const absl::Status status = RunOnRankThreads(1, [&](int rank) -> absl::Status {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = 1;
    options.store = &store;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                        comm::GlooCommunicator::Create(options));
    EngineConfig config = AdamConfig(EngineMode::kZero1);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(plan, rank, config, communicator.get()));
    EXPECT_EQ(engine->AverageGradients().status().code(), absl::StatusCode::kFailedPrecondition);
    // Before the hand-over.
    EXPECT_EQ(engine->ClipGradNorm(1.0, 2.0).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(engine->ClipGradNorm(-1.0, 2.0).status().code(), absl::StatusCode::kInvalidArgument);
    const absl::Status bad_norm = engine->ClipGradNorm(1.0, 1.0).status();
    EXPECT_EQ(bad_norm.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad_norm.message().find("norm_type"), absl::string_view::npos) << bad_norm;
    const absl::Status outside = engine->SetTensorsWithoutGradient({4});
    EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(outside.message().find("tensors_without_gradient"), absl::string_view::npos);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace zeroshard::engine
