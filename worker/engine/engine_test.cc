// Engine equivalence, threads as ranks over Gloo (TCP loopback) and an InMemoryStore: for W in
// {1, 2, 3, 4}, ddp, zero1 and zero2 are bitwise equal, reruns are bitwise identical, and 20
// steps match a single-process reference on the whole batch within stated tolerances (fp32;
// clipping; fp16 with dynamic loss scaling and an injected overflow; bf16 reduced in fp32).
#include "worker/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu_optimizer.h"
#include "sharding/model_catalog.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/element_convert.h"
#include "worker/workloads/testing/least_squares_workload.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;
using ::zeroshard::comm::testing::RunOnRankThreads;
using ::zeroshard::workloads::testing::LeastSquaresWorkload;

constexpr int64_t kGlobalBatch = 24;  // divisible by every W tested
constexpr int64_t kSteps = 20;
constexpr uint64_t kSeed = 7;

// Odd sizes so tensors straddle pieces; per-tensor weight decay (kWeightDecay or none) and lr
// scale; the minimum bucket size gives several buckets, more than the zero2 pool holds, and the
// larger tensors span two or three of them.
constexpr double kWeightDecay = 1e-3;
std::vector<sharding::TensorSpec> TestTensors() {
  std::vector<sharding::TensorSpec> tensors;
  auto add = [&](const char* name, int64_t elements, bool decayed, float lr_scale) {
    sharding::TensorSpec spec;
    spec.name = name;
    spec.shape = {elements};
    spec.num_elements = elements;
    spec.weight_decay = decayed ? kWeightDecay : 0.0;
    spec.lr_scale = lr_scale;
    tensors.push_back(spec);
  };
  add("head.weight", 300, true, 1.0f);
  add("head.bias", 7, false, 1.0f);
  add("block2.weight", 1000, true, 1.0f);
  add("block2.norm", 65, false, 1.0f);
  add("block1.weight", 129, true, 0.5f);
  add("block1.proj", 2000, true, 1.0f);
  add("embed.scale", 1, false, 1.0f);
  add("embed.weight", 513, true, 1.0f);
  return tensors;
}

sharding::ShardPlan TestPlan(int64_t world_size,
                             const std::vector<sharding::TensorSpec>& tensors = TestTensors()) {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  auto plan = sharding::ShardPlan::Create(tensors, world_size, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

struct RunResult {
  std::vector<std::vector<float>> params_by_rank;  // every tensor's parameters, concatenated
  std::vector<StepResult> steps;                   // rank 0's results
  std::vector<std::vector<StepResult>> steps_by_rank;
};

// Trains kSteps steps with `world_size` threads as ranks.
RunResult RunEngines(int64_t world_size, const EngineConfig& config, int64_t infinity_step = -1,
                     int64_t infinity_rank = 0,
                     const std::vector<sharding::TensorSpec>& tensors = TestTensors()) {
  const sharding::ShardPlan plan = TestPlan(world_size, tensors);
  comm::InMemoryStore store;
  RunResult run;
  run.params_by_rank.resize(world_size);
  run.steps_by_rank.resize(world_size);
  const absl::Status status =
      RunOnRankThreads(static_cast<int>(world_size), [&](int rank) -> absl::Status {
        comm::GlooCommunicatorOptions options;
        options.rank = rank;
        options.world_size = static_cast<int>(world_size);
        options.store = &store;
        options.rendezvous_timeout = absl::Seconds(30);
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                            comm::GlooCommunicator::Create(options));
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::Create(plan, rank, config, communicator.get()));
        LeastSquaresWorkload workload(tensors, kGlobalBatch, rank, world_size, kSeed);
        if (rank == infinity_rank) workload.InjectInfinityAtStep(infinity_step);
        ZS_RETURN_IF_ERROR(engine->InitializeParameters(
            [&](int64_t t, absl::Span<float> out) { return workload.InitialParameters(t, out); }));
        for (int64_t step = 0; step < kSteps; ++step) {
          ZS_ASSIGN_OR_RETURN(const double loss, workload.ForwardBackward(step, *engine, *engine));
          ZS_ASSIGN_OR_RETURN(const StepResult result, engine->Step(loss));
          run.steps_by_rank[rank].push_back(result);
        }
        for (int64_t t = 0; t < plan.num_tensors(); ++t) {
          ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
          run.params_by_rank[rank].insert(run.params_by_rank[rank].end(), values.begin(),
                                          values.end());
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  run.steps = run.steps_by_rank[0];
  return run;
}

struct ReferenceResult {
  std::vector<float> params;  // every tensor's parameters (param dtype, widened), concatenated
  std::vector<bool> skipped;
  std::vector<double> loss_scales;
};

// One process, the whole batch, no communication: the same storage rounding, loss scaling,
// clipping rule and optimizer kernel, with whole tensors as pieces.
ReferenceResult RunReference(const EngineConfig& config, int64_t infinity_step = -1) {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  const int64_t num_tensors = static_cast<int64_t>(tensors.size());
  LeastSquaresWorkload workload(tensors, kGlobalBatch, /*rank=*/0, /*world_size=*/1, kSeed);
  const int state_arrays = kernels::StateArraysPerParam(config.optimizer);
  const int param_size = numerics::DTypeSize(config.param_dtype);
  const int grad_size = numerics::DTypeSize(config.grad_dtype);
  std::vector<std::vector<float>> master(num_tensors), widened(num_tensors);
  std::vector<std::vector<std::vector<float>>> state(num_tensors);
  std::vector<std::vector<char>> params(num_tensors), stored(num_tensors);
  for (int64_t t = 0; t < num_tensors; ++t) {
    const int64_t n = tensors[t].num_elements;
    master[t].resize(n);
    EXPECT_TRUE(workload.InitialParameters(t, absl::MakeSpan(master[t])).ok());
    params[t].resize(n * param_size);
    ConvertElements(master[t].data(), DType::kFloat32, params[t].data(), config.param_dtype, n);
    widened[t].resize(n);
    ConvertElements(params[t].data(), config.param_dtype, widened[t].data(), DType::kFloat32, n);
    state[t].assign(state_arrays, std::vector<float>(n));
    stored[t].resize(n * grad_size);
  }
  ReferenceResult reference;
  double loss_scale = config.loss_scale.initial_scale;
  int64_t good_steps = 0;
  int64_t optimizer_step = 0;
  std::vector<std::vector<float>> gradients;
  for (int64_t step = 0; step < kSteps; ++step) {
    workload.LossAndGradients(
        step, 0, kGlobalBatch, [&](int64_t t) { return absl::MakeConstSpan(widened[t]); },
        &gradients);
    if (step == infinity_step) gradients[0][0] = INFINITY;
    std::vector<kernels::GradPiece> grad_pieces;
    std::vector<kernels::UpdatePiece> update_pieces;
    for (int64_t t = 0; t < num_tensors; ++t) {
      const int64_t n = tensors[t].num_elements;
      StoreScaledGradient(gradients[t].data(), static_cast<float>(loss_scale), n, config.grad_dtype,
                          stored[t].data(), config.grad_dtype);
      grad_pieces.push_back({stored[t].data(), config.grad_dtype, n});
      kernels::UpdatePiece piece;
      piece.grad = stored[t].data();
      piece.grad_dtype = config.grad_dtype;
      piece.master = master[t].data();
      for (int k = 0; k < state_arrays; ++k) piece.state[k] = state[t][k].data();
      piece.param_copy = params[t].data();
      piece.param_dtype = config.param_dtype;
      piece.length = n;
      piece.weight_decay = tensors[t].weight_decay;
      piece.lr_scale = tensors[t].lr_scale;
      update_pieces.push_back(piece);
    }
    auto stats = kernels::ComputeGradStatsCpu(grad_pieces, nullptr);
    EXPECT_TRUE(stats.ok());
    const double norm = std::sqrt(stats->sum_squares) / loss_scale;
    const bool skip = stats->non_finite || !std::isfinite(norm);
    reference.skipped.push_back(skip);
    reference.loss_scales.push_back(loss_scale);
    if (!skip) {
      double clip_coef = 1.0;
      if (config.clip_grad_norm > 0)
        clip_coef = std::min(1.0, config.clip_grad_norm / (norm + 1e-6));
      EXPECT_TRUE(kernels::ApplyUpdateCpu(config.optimizer, ++optimizer_step,
                                          static_cast<float>(clip_coef / loss_scale), update_pieces,
                                          nullptr)
                      .ok());
      for (int64_t t = 0; t < num_tensors; ++t) {
        ConvertElements(params[t].data(), config.param_dtype, widened[t].data(), DType::kFloat32,
                        tensors[t].num_elements);
      }
    }
    if (config.loss_scale.dynamic) {
      if (skip) {
        loss_scale *= config.loss_scale.backoff_factor;
        good_steps = 0;
      } else if (++good_steps == config.loss_scale.growth_interval) {
        loss_scale *= config.loss_scale.growth_factor;
        good_steps = 0;
      }
    }
  }
  for (int64_t t = 0; t < num_tensors; ++t) {
    reference.params.insert(reference.params.end(), widened[t].begin(), widened[t].end());
  }
  return reference;
}

// Every tensor's initial parameters, concatenated.
std::vector<float> InitialParameters() {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  const LeastSquaresWorkload workload(tensors, kGlobalBatch, /*rank=*/0, /*world_size=*/1, kSeed);
  std::vector<float> params;
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> values(tensors[t].num_elements);
    EXPECT_TRUE(workload.InitialParameters(static_cast<int64_t>(t), absl::MakeSpan(values)).ok());
    params.insert(params.end(), values.begin(), values.end());
  }
  return params;
}

// The workload's expected loss at `params` (every tensor's parameters, concatenated); NaN, with
// a failure, when `params` is too short.
double ExpectedLoss(const std::vector<float>& params) {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  const LeastSquaresWorkload workload(tensors, kGlobalBatch, /*rank=*/0, /*world_size=*/1, kSeed);
  std::vector<absl::Span<const float>> by_tensor;
  absl::Span<const float> rest = params;
  for (const sharding::TensorSpec& spec : tensors) {
    const size_t count = static_cast<size_t>(spec.num_elements);
    if (rest.size() < count) {
      ADD_FAILURE() << params.size() << " parameters are too few for the test tensors";
      return std::numeric_limits<double>::quiet_NaN();
    }
    by_tensor.push_back(rest.subspan(0, count));
    rest.remove_prefix(count);
  }
  return workload.ExpectedLoss([&](int64_t t) { return by_tensor[t]; });
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double MaxAbsDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

// Every rank holds the same parameters, bit for bit.
void ExpectRanksAgree(const RunResult& run) {
  for (size_t rank = 1; rank < run.params_by_rank.size(); ++rank) {
    EXPECT_TRUE(BitwiseEqual(run.params_by_rank[0], run.params_by_rank[rank])) << "rank " << rank;
  }
}

// The step results that must not depend on the mode.
void ExpectSameStepResults(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].skipped, b.steps[s].skipped) << "step " << s;
    EXPECT_EQ(a.steps[s].global_loss, b.steps[s].global_loss) << "step " << s;
    if (!a.steps[s].skipped) {
      EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << "step " << s;
    }
    EXPECT_EQ(a.steps[s].loss_scale, b.steps[s].loss_scale) << "step " << s;
    EXPECT_EQ(a.steps[s].optimizer_step, b.steps[s].optimizer_step) << "step " << s;
  }
}

// Runs every mode at `world_size`; checks they are bitwise equal to each other and, within
// `tolerance` (max absolute difference of any parameter), to the reference. Returns zero2's run.
RunResult CheckModes(int64_t world_size, EngineConfig config, double tolerance,
                     int64_t infinity_step = -1) {
  config.mode = EngineMode::kDdp;
  const RunResult ddp = RunEngines(world_size, config, infinity_step, world_size - 1);
  config.mode = EngineMode::kZero1;
  const RunResult zero1 = RunEngines(world_size, config, infinity_step, world_size - 1);
  config.mode = EngineMode::kZero2;
  const RunResult zero2 = RunEngines(world_size, config, infinity_step, world_size - 1);
  config.mode = EngineMode::kZero3;
  const RunResult zero3 = RunEngines(world_size, config, infinity_step, world_size - 1);
  ExpectRanksAgree(ddp);
  ExpectRanksAgree(zero1);
  ExpectRanksAgree(zero2);
  ExpectRanksAgree(zero3);
  EXPECT_TRUE(BitwiseEqual(zero2.params_by_rank[0], zero3.params_by_rank[0])) << "zero2 vs zero3";
  ExpectSameStepResults(zero2, zero3);
  EXPECT_TRUE(BitwiseEqual(ddp.params_by_rank[0], zero1.params_by_rank[0])) << "ddp vs zero1";
  EXPECT_TRUE(BitwiseEqual(ddp.params_by_rank[0], zero2.params_by_rank[0])) << "ddp vs zero2";
  ExpectSameStepResults(ddp, zero1);
  ExpectSameStepResults(ddp, zero2);
  const ReferenceResult reference = RunReference(config, infinity_step);
  const double difference = MaxAbsDifference(zero2.params_by_rank[0], reference.params);
  EXPECT_LE(difference, tolerance) << "W=" << world_size;
  std::cout << "W=" << world_size << ": max |engine - reference| = " << difference << "\n";
  // The run really trained: parameters moved by far more than the tolerance.
  const ReferenceResult untrained = [&] {
    EngineConfig frozen = config;
    frozen.optimizer.lr = 0.0;
    return RunReference(frozen);
  }();
  const double movement = MaxAbsDifference(untrained.params, reference.params);
  std::cout << "W=" << world_size << ": max parameter movement = " << movement << "\n";
  EXPECT_GT(movement, 10 * tolerance);
  for (size_t s = 0; s < zero2.steps.size(); ++s) {
    EXPECT_EQ(zero2.steps[s].skipped, reference.skipped[s]) << "step " << s;
    EXPECT_EQ(zero2.steps[s].loss_scale, reference.loss_scales[s]) << "step " << s;
  }
  return zero2;
}

EngineConfig AdamConfig() {
  EngineConfig config;
  config.optimizer.kind = kernels::OptimizerKind::kAdam;
  config.optimizer.lr = 1e-3;
  config.threads = 2;
  return config;
}

class EngineEquivalenceTest : public ::testing::TestWithParam<int> {};

// fp32 parameters and gradients: the reference differs only by the order of the gradient sums
// (per-rank means added over ranks vs. one mean over the batch), ~1e-7 relative; after 20 Adam
// steps at lr 1e-3 parameters (~1e-2 in size, moving ~1e-2) agree within 1e-7 (seen: <1e-8).
TEST_P(EngineEquivalenceTest, Fp32AdamModesAreBitwiseEqualAndMatchTheReference) {
  const int world_size = GetParam();
  const EngineConfig config = AdamConfig();
  const RunResult zero2 = CheckModes(world_size, config, /*tolerance=*/1e-7);
  // Loss falls. Each step's loss is over a fresh batch of 24 samples in ~4000 dimensions, and
  // that sampling noise (seen: 0.13 to 0.36) swamps what 20 steps at lr 1e-3 gain, so compare
  // the loss's expectation over the features instead (seen: 0.275 at the start, 0.257 after).
  EXPECT_LT(ExpectedLoss(zero2.params_by_rank[0]), ExpectedLoss(InitialParameters()));
  for (const StepResult& step : zero2.steps) EXPECT_FALSE(step.skipped);
  EXPECT_EQ(zero2.steps.back().optimizer_step, kSteps);
  // A rerun is bitwise identical.
  EngineConfig rerun = config;
  rerun.mode = EngineMode::kZero2;
  rerun.threads = 1;  // nor does the thread count matter
  const RunResult again = RunEngines(world_size, rerun);
  EXPECT_TRUE(BitwiseEqual(zero2.params_by_rank[0], again.params_by_rank[0]));
}

// Clipping active on every step (max norm far below the gradient norm), SGD with momentum.
TEST_P(EngineEquivalenceTest, GlobalNormClippingMatchesTheReference) {
  const int world_size = GetParam();
  EngineConfig config;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.5;
  config.optimizer.momentum = 0.9;
  config.clip_grad_norm = 0.05;
  const RunResult zero2 = CheckModes(world_size, config, /*tolerance=*/1e-7);
  for (const StepResult& step : zero2.steps) {
    EXPECT_LT(step.clip_coef, 1.0);
    EXPECT_NEAR(step.clip_coef, 0.05 / (step.grad_norm + 1e-6), 1e-12);
  }
}

// fp16 gradients and parameters, dynamic loss scaling (growth every 4 good steps), an Inf in the
// last rank's gradient at step 5: that step is skipped on every rank, the optimizer step count
// does not advance and the scale halves. fp16 storage rounds per rank in the engine and once in
// the reference (2^-11 relative), and fp16 parameters (ulp ~1.5e-5 here) may round differently:
// the tolerance is 5e-5 (seen: one fp16 ulp).
TEST_P(EngineEquivalenceTest, Fp16DynamicLossScalingSkipsTheOverflowStep) {
  const int world_size = GetParam();
  EngineConfig config = AdamConfig();
  config.param_dtype = DType::kFloat16;
  config.grad_dtype = DType::kFloat16;
  config.loss_scale.initial_scale = 256.0;
  config.loss_scale.dynamic = true;
  config.loss_scale.growth_interval = 4;
  constexpr int64_t kOverflowStep = 5;
  const RunResult zero2 = CheckModes(world_size, config, /*tolerance=*/5e-5, kOverflowStep);
  for (int64_t s = 0; s < kSteps; ++s) {
    const StepResult& step = zero2.steps[s];
    EXPECT_EQ(step.skipped, s == kOverflowStep) << "step " << s;
    EXPECT_EQ(step.optimizer_step, s < kOverflowStep ? s + 1 : s) << "step " << s;
  }
  EXPECT_EQ(zero2.steps[kOverflowStep - 1].next_loss_scale, 512.0);  // grew after 4 good steps
  EXPECT_EQ(zero2.steps[kOverflowStep].loss_scale, 512.0);
  EXPECT_EQ(zero2.steps[kOverflowStep].next_loss_scale, 256.0);  // backed off
  EXPECT_EQ(zero2.steps.back().next_loss_scale, 256.0 * 8.0);    // 14 good steps: 3 growths
}

// bf16 parameters and gradients reduced in fp32 (the bucket pool path in every mode), with SGD:
// the engine rounds each rank's gradient to bf16, the reference the whole batch's (2^-9
// relative each), so parameters agree within 2e-4 (a bf16 ulp is 1.2e-4 at 0.03; seen: one ulp,
// against a movement of 3e-3). lr 1e-3 keeps SGD stable on this problem. SGD rather
// than Adam because Adam turns the rounding noise of nearly cancelling gradient sums into full
// lr-sized steps of either sign, which says nothing about the engine.
TEST_P(EngineEquivalenceTest, Bf16GradientsReducedInFp32) {
  const int world_size = GetParam();
  EngineConfig config;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 1e-3;
  config.optimizer.momentum = 0.5;
  config.param_dtype = DType::kBFloat16;
  config.grad_dtype = DType::kBFloat16;
  config.reduce_dtype = DType::kFloat32;
  CheckModes(world_size, config, /*tolerance=*/2e-4);
}

// bf16 gradients reduced in bf16 (reduce_dtype says so): in place in ddp and zero1.
TEST_P(EngineEquivalenceTest, Bf16GradientsReducedInBf16) {
  const int world_size = GetParam();
  EngineConfig config;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 1e-3;
  config.optimizer.momentum = 0.5;
  config.param_dtype = DType::kBFloat16;
  config.grad_dtype = DType::kBFloat16;
  config.reduce_dtype = DType::kBFloat16;
  CheckModes(world_size, config, /*tolerance=*/2e-4);
}

// Misuse is refused with the documented codes and leaves the step usable.
TEST(EngineTest, RefusesBadSegmentsAndIncompleteSteps) {
  const sharding::ShardPlan plan = TestPlan(1);
  comm::GlooCommunicatorOptions options;
  auto communicator = comm::GlooCommunicator::Create(options);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  EngineConfig config = AdamConfig();
  EXPECT_EQ(Engine::Create(plan, 1, config, communicator->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.threads = 0;
  EXPECT_EQ(Engine::Create(plan, 0, config, communicator->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = AdamConfig();
  auto engine = Engine::Create(plan, 0, config, communicator->get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  const int64_t first_end = e.GradSegmentEnd(0, 0);
  EXPECT_EQ(e.GradBuffer(plan.num_tensors(), 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.GradBuffer(0, 0, first_end + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.GradBuffer(1, 0, e.GradSegmentEnd(1, 0)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // tensor 0 comes first
  EXPECT_EQ(e.GradWritten(0, 0, first_end).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.GradBuffer(0, 0, first_end).ok());
  EXPECT_EQ(e.GradBuffer(0, 0, first_end).status().code(),
            absl::StatusCode::kFailedPrecondition);  // still open
  ASSERT_TRUE(e.GradWritten(0, 0, first_end).ok());
  EXPECT_EQ(e.GradBuffer(0, 0, first_end).status().code(),
            absl::StatusCode::kFailedPrecondition);  // handed twice
  EXPECT_EQ(e.Step(1.0).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    const std::vector<float> gradient(plan.tensors()[t].num_elements, 0.5f);
    if (t == 0) {  // the rest of tensor 0, after its first segment
      for (int64_t begin = first_end; begin < static_cast<int64_t>(gradient.size());) {
        const int64_t end = e.GradSegmentEnd(0, begin);
        ASSERT_TRUE(e.GradBuffer(0, begin, end).ok());
        ASSERT_TRUE(e.GradWritten(0, begin, end).ok());
        begin = end;
      }
      continue;
    }
    ASSERT_TRUE(workloads::CopyGradientToSink(e, t, gradient).ok());
  }
  auto result = e.Step(1.0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->optimizer_step, 1);
  EXPECT_EQ(result->global_loss, 1.0);
}

// Issue 26: per-group values set for a step (an attached trainer's param_groups) give the same
// bits as a configuration holding them; a group that would change the state's shape, or a group
// list too short, is refused and changes nothing.
TEST(EngineTest, GroupValuesReplaceTheConfigurationsBitwise) {
  const sharding::ShardPlan plan = TestPlan(1);
  comm::GlooCommunicatorOptions options;
  auto grouped_comm = comm::GlooCommunicator::Create(options);
  auto plain_comm = comm::GlooCommunicator::Create(options);
  ASSERT_TRUE(grouped_comm.ok() && plain_comm.ok());
  kernels::GroupHyperparameters decayed;
  decayed.lr = 0.02;
  decayed.weight_decay = 0.0;
  decayed.beta1 = 0.8;
  decayed.beta2 = 0.95;
  decayed.eps = 1e-6;
  // One group per (weight_decay, lr_scale) of the test tensors, holding the same values.
  EngineConfig grouped_config = AdamConfig();
  std::vector<kernels::GroupHyperparameters> groups;
  for (const sharding::TensorSpec& spec : plan.tensors()) {
    kernels::GroupHyperparameters group = decayed;
    group.lr = decayed.lr * spec.lr_scale;
    group.weight_decay = spec.weight_decay;
    int32_t index = 0;
    while (index < static_cast<int32_t>(groups.size()) &&
           (groups[index].lr != group.lr || groups[index].weight_decay != group.weight_decay)) {
      ++index;
    }
    if (index == static_cast<int32_t>(groups.size())) groups.push_back(group);
    grouped_config.tensor_groups.push_back(index);
  }
  ASSERT_GT(groups.size(), 2u);
  EngineConfig plain_config = AdamConfig();
  plain_config.optimizer.lr = decayed.lr;
  plain_config.optimizer.beta1 = decayed.beta1;
  plain_config.optimizer.beta2 = decayed.beta2;
  plain_config.optimizer.eps = decayed.eps;
  auto grouped = Engine::Create(plan, 0, grouped_config, grouped_comm->get());
  auto plain = Engine::Create(plan, 0, plain_config, plain_comm->get());
  ASSERT_TRUE(grouped.ok() && plain.ok());
  EXPECT_EQ((*plain)->SetGroupHyperparameters(groups).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*grouped)->SetGroupHyperparameters({decayed}).code(),
            absl::StatusCode::kInvalidArgument);  // too few groups
  std::vector<kernels::GroupHyperparameters> bad = groups;
  bad[1].beta1 = 1.5;
  const absl::Status refused = (*grouped)->SetGroupHyperparameters(bad);
  EXPECT_EQ(refused.message(), "param_groups[1]: beta1 must be in [0, 1), got 1.5");
  ASSERT_TRUE((*grouped)->SetGroupHyperparameters(groups).ok());
  for (Engine* e : {grouped->get(), plain->get()}) {
    ASSERT_TRUE(e->InitializeParameters([&](int64_t t, absl::Span<float> out) {
                   for (size_t i = 0; i < out.size(); ++i) out[i] = 0.01f * (t + 1) + 0.001f * i;
                   return absl::OkStatus();
                 }).ok());
    for (int step = 0; step < 3; ++step) {
      for (int64_t t = 0; t < plan.num_tensors(); ++t) {
        std::vector<float> gradient(plan.tensors()[t].num_elements);
        for (size_t i = 0; i < gradient.size(); ++i) gradient[i] = 0.1f * (step + 1) - 0.003f * i;
        ASSERT_TRUE(workloads::CopyGradientToSink(*e, t, gradient).ok());
      }
      ASSERT_TRUE(e->Step(1.0).ok());
    }
  }
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    EXPECT_TRUE(BitwiseEqual(*(*grouped)->ParametersOnHost(t), *(*plain)->ParametersOnHost(t)))
        << t;
  }
}

// Issue 26, item 2: every rank checks that its group values agree with the others', on the
// step's statistics all-reduce. Two ranks whose trainers sent different betas both fail the step
// (none updates); the same values step on.
TEST(EngineTest, RanksWithDifferentGroupValuesFailTheStepTogether) {
  constexpr int kRanks = 2;
  const sharding::ShardPlan plan = TestPlan(kRanks);
  comm::InMemoryStore store;
  std::vector<absl::Status> agreed(kRanks), differed(kRanks);
  std::vector<int64_t> steps_after(kRanks, -1);
  const absl::Status status = RunOnRankThreads(kRanks, [&](int rank) -> absl::Status {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = kRanks;
    options.store = &store;
    options.rendezvous_timeout = absl::Seconds(30);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                        comm::GlooCommunicator::Create(options));
    EngineConfig config = AdamConfig();
    config.tensor_groups.assign(plan.num_tensors(), 0);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(plan, rank, config, communicator.get()));
    LeastSquaresWorkload workload(TestTensors(), kGlobalBatch, rank, kRanks, kSeed);
    ZS_RETURN_IF_ERROR(engine->InitializeParameters(
        [&](int64_t t, absl::Span<float> out) { return workload.InitialParameters(t, out); }));
    kernels::GroupHyperparameters group;
    ZS_RETURN_IF_ERROR(engine->SetGroupHyperparameters({group}));
    ZS_ASSIGN_OR_RETURN(double loss, workload.ForwardBackward(0, *engine, *engine));
    agreed[rank] = engine->Step(loss).status();
    if (rank == 1) group.beta1 = 0.8;  // this rank's trainer changed betas, rank 0's did not
    ZS_RETURN_IF_ERROR(engine->SetGroupHyperparameters({group}));
    ZS_ASSIGN_OR_RETURN(loss, workload.ForwardBackward(1, *engine, *engine));
    differed[rank] = engine->Step(loss).status();
    steps_after[rank] = engine->optimizer_step();
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_TRUE(agreed[rank].ok()) << agreed[rank];
    EXPECT_TRUE(absl::IsFailedPrecondition(differed[rank])) << differed[rank];
    EXPECT_TRUE(absl::StrContains(differed[rank].message(), "param_groups: the ranks' trainers"))
        << differed[rank];
    EXPECT_EQ(steps_after[rank], 1);  // the second step updated nothing
  }
}

// Segments end at bucket boundaries: a tensor spanning buckets is handed over in several.
// --memory_limit_bytes between zero3's need and zero2's: zero2's engine is refused with the
// limit, what it asked for and what the mode needs in all; zero3's is made within the limit.
// Fails without the limit (both made) or without the figures in the message.
TEST(EngineTest, AMemoryLimitBetweenTheModesRefusesZero2AndAdmitsZero3) {
  // Seven 64 x 64 layers at W = 4: zero3 saves 3/4 of the parameters, more than its pool of two
  // layers' buckets. Creating an engine runs no collective: rank 0 of an identity communicator.
  constexpr int64_t kWorldSize = 4;
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors =
      sharding::TensorsForLayerSizes({64, 64, 64, 64, 64, 64, 64, 64});
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  sharding::ShardPlanOptions plan_options;
  plan_options.bucket_elems = sharding::kMinBucketElems;
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(*tensors, kWorldSize, plan_options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  comm::testing::IdentityCommunicator communicator(/*rank=*/0, kWorldSize);
  EngineConfig config = AdamConfig();
  auto total_of = [&](EngineMode mode) -> int64_t {
    config.mode = mode;
    config.memory_limit_bytes = 0;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(*plan, 0, config, &communicator);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? (*engine)->Memory().total() : 0;
  };
  const int64_t zero2_bytes = total_of(EngineMode::kZero2);
  const int64_t zero3_bytes = total_of(EngineMode::kZero3);
  ASSERT_LT(zero3_bytes, zero2_bytes);
  const int64_t limit = (zero2_bytes + zero3_bytes) / 2;
  config.memory_limit_bytes = limit;
  config.mode = EngineMode::kZero2;
  absl::StatusOr<std::unique_ptr<Engine>> refused = Engine::Create(*plan, 0, config, &communicator);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), absl::StrCat("--memory_limit_bytes=", limit)))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "zero2 at W=4 needs "))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), absl::StrCat(zero2_bytes, " bytes")))
      << refused.status();
  config.mode = EngineMode::kZero3;
  absl::StatusOr<std::unique_ptr<Engine>> admitted =
      Engine::Create(*plan, 0, config, &communicator);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_LE((*admitted)->Memory().peak_total_bytes, limit);
}

// Eight one-tensor modules in one bucket, two gather windows: each module after the first
// copies its part of the bucket from a neighbour's window, and a window holding only its own part
// must never be copied from. Fails when a partly copied bucket is copied on (the later modules
// read another module's stale values or zeros, and zero3 departs from zero2).
TEST(EngineTest, Zero3ModulesSharingABucketEqualZero2) {
  std::vector<sharding::TensorSpec> tensors;
  for (int m = 0; m < 8; ++m) {
    sharding::TensorSpec spec;
    spec.name = absl::StrCat("m", m, ".weight");
    spec.shape = {100};
    spec.num_elements = 100;
    tensors.push_back(spec);
  }
  for (const int64_t world_size : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("W=", world_size));
    EngineConfig config = AdamConfig();
    config.mode = EngineMode::kZero2;
    const RunResult zero2 = RunEngines(world_size, config, -1, 0, tensors);
    config.mode = EngineMode::kZero3;
    const RunResult zero3 = RunEngines(world_size, config, -1, 0, tensors);
    ExpectRanksAgree(zero3);
    EXPECT_TRUE(BitwiseEqual(zero2.params_by_rank[0], zero3.params_by_rank[0]));
    ExpectSameStepResults(zero2, zero3);
  }
}

TEST(EngineTest, SegmentsFollowTheBuckets) {
  const sharding::ShardPlan plan = TestPlan(1);
  comm::GlooCommunicatorOptions options;
  auto communicator = comm::GlooCommunicator::Create(options);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  auto engine = Engine::Create(plan, 0, AdamConfig(), communicator->get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    const sharding::TensorPlacement& placement = plan.placement(t);
    std::vector<int64_t> ends;
    for (int64_t begin = 0; begin < placement.num_elements;) {
      begin = (*engine)->GradSegmentEnd(t, begin);
      ends.push_back(begin);
    }
    ASSERT_EQ(static_cast<int64_t>(ends.size()), placement.num_buckets) << "tensor " << t;
    for (size_t k = 0; k + 1 < ends.size(); ++k) {
      EXPECT_EQ(placement.flat_offset + ends[k],
                plan.buckets()[placement.first_bucket + k].flat_end());
    }
    EXPECT_EQ(ends.back(), placement.num_elements);
  }
  // block1.proj (2000 elements) spans three 1024-element buckets.
  EXPECT_EQ(plan.placement(5).num_buckets, 3);
}

// The timings of the collectives: the reductions' window is finite and not empty; a step issues
// all-gathers only in zero1/zero2 and only when it updated the parameters, and the next step
// reports how long they ran and how long the owner waited for them.
TEST(EngineTest, TimingsOfTheCollectives) {
  constexpr int64_t kOverflowStep = 3;
  EngineConfig config = AdamConfig();
  for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
    config.mode = mode;
    const RunResult run = RunEngines(/*world_size=*/2, config, kOverflowStep);
    for (const std::vector<StepResult>& steps : run.steps_by_rank) {
      ASSERT_EQ(static_cast<int64_t>(steps.size()), kSteps);
      for (int64_t s = 0; s < kSteps; ++s) {
        const StepTimings& timings = steps[s].timings;
        SCOPED_TRACE(absl::StrCat(EngineModeName(mode), " step ", s));
        EXPECT_EQ(steps[s].skipped, s == kOverflowStep);
        EXPECT_TRUE(std::isfinite(timings.reduce_wall_ms));
        EXPECT_GT(timings.reduce_wall_ms, 0.0);
        const bool issued = mode != EngineMode::kDdp && !steps[s].skipped;
        EXPECT_GE(timings.allgather_ms, 0.0);
        EXPECT_LE(timings.allgather_ms, timings.step_ms);
        if (!issued) {
          EXPECT_EQ(timings.allgather_ms, 0.0);
        }
        const bool previous_issued = mode != EngineMode::kDdp && s > 0 && !steps[s - 1].skipped;
        EXPECT_TRUE(std::isfinite(timings.allgather_run_ms));
        EXPECT_TRUE(std::isfinite(timings.param_wait_ms));
        EXPECT_GE(timings.param_wait_ms, 0.0);
        if (previous_issued) {
          EXPECT_GT(timings.allgather_run_ms, 0.0);
        } else {
          EXPECT_EQ(timings.allgather_run_ms, 0.0);
          EXPECT_EQ(timings.param_wait_ms, 0.0);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EngineEquivalenceTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("W", info.param);
                         });

}  // namespace
}  // namespace zeroshard::engine
