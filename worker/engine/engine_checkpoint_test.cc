// Engine checkpoints: what each rank saves covers every array exactly once in W-independent
// coordinates; loading it at any W' in {1, 2, 3, 4} restores the same parameters and optimizer
// state bit for bit; resuming at the same W (from any mode) continues bitwise as an
// uninterrupted run; resuming at another W matches an uninterrupted run there within 1e-6.
// Threads as ranks over Gloo (TCP loopback).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/engine.h"
#include "worker/workloads/testing/least_squares_workload.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;
using ::zeroshard::comm::testing::RunOnRankThreads;
using ::zeroshard::workloads::testing::LeastSquaresWorkload;

constexpr int64_t kGlobalBatch = 24;  // divisible by every W tested
constexpr uint64_t kSeed = 11;

// Odd sizes so tensors straddle pieces and buckets (the minimum bucket size gives several).
std::vector<sharding::TensorSpec> TestTensors() {
  std::vector<sharding::TensorSpec> tensors;
  auto add = [&](const char* name, int64_t elements, double weight_decay) {
    sharding::TensorSpec spec;
    spec.name = name;
    spec.shape = {elements};
    spec.num_elements = elements;
    spec.weight_decay = weight_decay;
    tensors.push_back(spec);
  };
  add("0.weight", 1500, 1e-2);
  add("0.bias", 7, 0.0);
  add("2.weight", 2100, 1e-2);
  add("2.bias", 65, 0.0);
  add("4.weight", 1, 1e-2);
  return tensors;
}

sharding::ShardPlan TestPlan(int64_t world_size) {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(TestTensors(), world_size, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

EngineConfig AdamWConfig(EngineMode mode, DType param_dtype = DType::kFloat32) {
  EngineConfig config;
  config.mode = mode;
  config.optimizer.kind = kernels::OptimizerKind::kAdamW;
  config.optimizer.lr = 1e-2;
  config.param_dtype = param_dtype;
  return config;
}

// A checkpoint as the ranks' staging buffers describe it, assembled per (state, tensor) into
// whole arrays, with how many times each element was saved.
struct Checkpoint {
  Engine::SavedScalars scalars;
  int64_t next_step = 0;
  std::map<std::pair<std::string, int64_t>, std::vector<char>> arrays;
  std::map<std::pair<std::string, int64_t>, std::vector<int>> saved_count;
};

struct Segment {
  std::vector<std::vector<float>> params_by_rank;  // every tensor widened, concatenated
  Checkpoint saved;                                // after the segment's last step
};

// Runs steps [first_step, end_step) at `world_size`, from the initial parameters or from
// `resume_from`, and saves a checkpoint at the end.
Segment RunSegment(int64_t world_size, const EngineConfig& config, int64_t first_step,
                   int64_t end_step, const Checkpoint* resume_from) {
  const sharding::ShardPlan plan = TestPlan(world_size);
  comm::InMemoryStore store;
  Segment segment;
  segment.params_by_rank.resize(world_size);
  segment.saved.next_step = end_step;
  absl::Mutex mu;
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
        LeastSquaresWorkload workload(TestTensors(), kGlobalBatch, rank, world_size, kSeed);
        if (resume_from == nullptr) {
          ZS_RETURN_IF_ERROR(engine->InitializeParameters([&](int64_t t, absl::Span<float> out) {
            return workload.InitialParameters(t, out);
          }));
        } else {
          ZS_RETURN_IF_ERROR(engine->RestoreState(
              resume_from->scalars,
              [&](const Engine::SavedFragment& range, absl::Span<char> out) -> absl::Status {
                const auto found = resume_from->arrays.find({range.state, range.tensor});
                if (found == resume_from->arrays.end()) {
                  return absl::NotFoundError(absl::StrCat("no array ", range.state));
                }
                const int64_t size = numerics::DTypeSize(range.dtype);
                EXPECT_EQ(static_cast<int64_t>(out.size()), (range.end - range.begin) * size);
                std::memcpy(out.data(), found->second.data() + range.begin * size, out.size());
                return absl::OkStatus();
              }));
        }
        for (int64_t step = first_step; step < end_step; ++step) {
          ZS_ASSIGN_OR_RETURN(const double loss, workload.ForwardBackward(step, *engine, *engine));
          ZS_RETURN_IF_ERROR(engine->Step(loss).status());
        }
        std::vector<char> staging(engine->SavedBytes());
        ZS_ASSIGN_OR_RETURN(const Engine::SavedScalars scalars,
                            engine->CopyStateTo(absl::MakeSpan(staging)));
        // A fragment at a time, in chunks of 100 elements: the same bytes.
        for (size_t i = 0; i < engine->SavedFragments().size(); ++i) {
          const Engine::SavedFragment& fragment = engine->SavedFragments()[i];
          const int64_t size = numerics::DTypeSize(fragment.dtype);
          std::vector<char> chunk;
          for (int64_t first = 0; first < fragment.end - fragment.begin; first += 100) {
            chunk.resize(std::min<int64_t>(100, fragment.end - fragment.begin - first) * size);
            ZS_RETURN_IF_ERROR(engine->CopyFragmentTo(i, first, absl::MakeSpan(chunk)));
            if (std::memcmp(chunk.data(), staging.data() + fragment.staging_offset + first * size,
                            chunk.size()) != 0) {
              return absl::InternalError(
                  absl::StrCat("CopyFragmentTo(", i, ", ", first, ") differs from CopyStateTo"));
            }
          }
          chunk.resize(size);
          if (engine->CopyFragmentTo(i, fragment.end - fragment.begin, absl::MakeSpan(chunk))
                  .ok()) {
            return absl::InternalError("CopyFragmentTo accepted a range past the fragment");
          }
        }
        {
          absl::MutexLock lock(&mu);
          segment.saved.scalars = scalars;
          for (const Engine::SavedFragment& fragment : engine->SavedFragments()) {
            const int64_t size = numerics::DTypeSize(fragment.dtype);
            const int64_t elements = plan.tensors()[fragment.tensor].num_elements;
            std::vector<char>& array = segment.saved.arrays[{fragment.state, fragment.tensor}];
            std::vector<int>& count = segment.saved.saved_count[{fragment.state, fragment.tensor}];
            array.resize(elements * size);
            count.resize(elements);
            std::memcpy(array.data() + fragment.begin * size,
                        staging.data() + fragment.staging_offset, fragment.bytes());
            for (int64_t e = fragment.begin; e < fragment.end; ++e) ++count[e];
          }
        }
        for (int64_t t = 0; t < plan.num_tensors(); ++t) {
          ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
          segment.params_by_rank[rank].insert(segment.params_by_rank[rank].end(), values.begin(),
                                              values.end());
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return segment;
}

// Every element of every array was saved by exactly one rank.
void ExpectSavedOnce(const Checkpoint& checkpoint, int num_arrays) {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  EXPECT_EQ(checkpoint.arrays.size(), static_cast<size_t>(num_arrays) * tensors.size());
  for (const auto& [key, count] : checkpoint.saved_count) {
    ASSERT_EQ(static_cast<int64_t>(count.size()), tensors[key.second].num_elements);
    for (size_t e = 0; e < count.size(); ++e) {
      ASSERT_EQ(count[e], 1) << key.first << " of tensor " << key.second << " element " << e;
    }
  }
}

bool SameBits(const Checkpoint& a, const Checkpoint& b) {
  return a.arrays == b.arrays && a.scalars.optimizer_step == b.scalars.optimizer_step &&
         a.scalars.loss_scale == b.scalars.loss_scale &&
         a.scalars.good_steps == b.scalars.good_steps;
}

// Per tensor, max |a - b| / max |a|.
double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  double worst = 0.0;
  size_t offset = 0;
  for (const sharding::TensorSpec& tensor : tensors) {
    double diff = 0.0;
    double scale = 0.0;
    for (int64_t e = 0; e < tensor.num_elements; ++e) {
      diff = std::max(diff, std::fabs(double{a[offset + e]} - double{b[offset + e]}));
      scale = std::max(scale, std::fabs(double{a[offset + e]}));
    }
    worst = std::max(worst, scale > 0.0 ? diff / scale : diff);
    offset += tensor.num_elements;
  }
  return worst;
}

TEST(EngineCheckpointTest, EveryArrayIsSavedOnceAndNamedAsTorchNamesIt) {
  const Segment run = RunSegment(3, AdamWConfig(EngineMode::kZero2), 0, 2, nullptr);
  ExpectSavedOnce(run.saved, /*param, exp_avg, exp_avg_sq=*/3);
  EXPECT_TRUE(run.saved.arrays.count({"exp_avg", 0}));
  EXPECT_TRUE(run.saved.arrays.count({"exp_avg_sq", 4}));
  EXPECT_EQ(run.saved.scalars.optimizer_step, 2);
  // The saved parameters are the ones every rank holds.
  std::vector<float> saved_params;
  for (int64_t t = 0; t < 5; ++t) {
    const std::vector<char>& bytes = run.saved.arrays.at({"param", t});
    const float* values = reinterpret_cast<const float*>(bytes.data());
    saved_params.insert(saved_params.end(), values, values + bytes.size() / sizeof(float));
  }
  for (const std::vector<float>& params : run.params_by_rank) EXPECT_EQ(params, saved_params);
}

// The reshard matrix: saved at W, loaded at W', saved again at once: the same bits.
TEST(EngineCheckpointTest, LoadingAtAnyWorldSizeRestoresEveryArrayExactly) {
  for (const EngineMode mode : {EngineMode::kZero2, EngineMode::kZero1, EngineMode::kDdp}) {
    const EngineConfig config = AdamWConfig(mode);
    for (int64_t from = 1; from <= 4; ++from) {
      const Segment saved = RunSegment(from, config, 0, 2, nullptr);
      ExpectSavedOnce(saved.saved, 3);
      for (int64_t to = 1; to <= 4; ++to) {
        if (mode != EngineMode::kZero2 && to != from % 4 + 1) continue;  // one W' each
        SCOPED_TRACE(absl::StrCat(EngineModeName(mode), " W ", from, " -> W' ", to));
        const Segment loaded = RunSegment(to, config, 2, 2, &saved.saved);
        EXPECT_TRUE(SameBits(saved.saved, loaded.saved));
        for (const std::vector<float>& params : loaded.params_by_rank) {
          EXPECT_EQ(params, saved.params_by_rank[0]);
        }
      }
    }
  }
}

TEST(EngineCheckpointTest, Bf16ParametersSaveAndRestoreTheirMasters) {
  const EngineConfig config = AdamWConfig(EngineMode::kZero2, DType::kBFloat16);
  const Segment saved = RunSegment(2, config, 0, 3, nullptr);
  ExpectSavedOnce(saved.saved, /*param, master, exp_avg, exp_avg_sq=*/4);
  EXPECT_EQ(saved.saved.arrays.at({"param", 0}).size(), 1500u * 2);
  EXPECT_EQ(saved.saved.arrays.at({"master", 0}).size(), 1500u * 4);
  const Segment loaded = RunSegment(3, config, 3, 3, &saved.saved);
  EXPECT_TRUE(SameBits(saved.saved, loaded.saved));
}

TEST(EngineCheckpointTest, ResumingAtTheSameWorldSizeIsBitwiseAnUninterruptedRun) {
  const Segment uninterrupted = RunSegment(2, AdamWConfig(EngineMode::kZero2), 0, 6, nullptr);
  // Saved by each mode (they are bitwise equal at one W), resumed by zero2.
  for (const EngineMode saved_by : {EngineMode::kZero2, EngineMode::kDdp, EngineMode::kZero1}) {
    SCOPED_TRACE(EngineModeName(saved_by));
    const Segment first = RunSegment(2, AdamWConfig(saved_by), 0, 3, nullptr);
    const Segment second = RunSegment(2, AdamWConfig(EngineMode::kZero2), 3, 6, &first.saved);
    EXPECT_TRUE(SameBits(uninterrupted.saved, second.saved));
    EXPECT_EQ(second.params_by_rank, uninterrupted.params_by_rank);
  }
}

TEST(EngineCheckpointTest, ResumingAtAnotherWorldSizeMatchesAnUninterruptedRunThere) {
  const EngineConfig config = AdamWConfig(EngineMode::kZero2);
  const Segment first = RunSegment(4, config, 0, 5, nullptr);
  const Segment resumed = RunSegment(3, config, 5, 25, &first.saved);
  const Segment uninterrupted = RunSegment(3, config, 0, 25, nullptr);
  const double difference =
      MaxRelativeDifference(uninterrupted.params_by_rank[0], resumed.params_by_rank[0]);
  EXPECT_LE(difference, 1e-6);
  // Not trivially equal: the first 5 steps' reductions summed in another order.
  EXPECT_GT(difference, 0.0);
}

TEST(EngineCheckpointTest, RefusesBadStagingScalarsAndPassesReaderErrorsOn) {
  const sharding::ShardPlan plan = TestPlan(1);
  comm::GlooCommunicatorOptions options;
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> communicator =
      comm::GlooCommunicator::Create(options);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(plan, 0, AdamWConfig(EngineMode::kZero2), communicator->get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<char> staging((*engine)->SavedBytes() - 1);
  EXPECT_EQ((*engine)->CopyStateTo(absl::MakeSpan(staging)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto never = [](const Engine::SavedFragment&, absl::Span<char>) {
    ADD_FAILURE() << "read after bad scalars";
    return absl::OkStatus();
  };
  Engine::SavedScalars bad;
  bad.loss_scale = 0.0;
  absl::Status status = (*engine)->RestoreState(bad, never);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("loss_scale"), absl::string_view::npos) << status;
  bad = {};
  bad.optimizer_step = -1;
  EXPECT_EQ((*engine)->RestoreState(bad, never).code(), absl::StatusCode::kInvalidArgument);
  // Per-tensor steps (issue 26): one per tensor, none past the optimizer's step.
  bad = {};
  bad.optimizer_step = 3;
  bad.tensor_steps.assign(plan.num_tensors() - 1, 3);
  status = (*engine)->RestoreState(bad, never);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tensor_steps"), absl::string_view::npos) << status;
  bad.tensor_steps.assign(plan.num_tensors(), 3);
  bad.tensor_steps[1] = 4;
  status = (*engine)->RestoreState(bad, never);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tensor_steps[1]"), absl::string_view::npos) << status;
  status = (*engine)->RestoreState({}, [](const Engine::SavedFragment&, absl::Span<char>) {
    return absl::DataLossError("checksum mismatch");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
}

// Issue 26: each tensor's own step count is a scalar of the checkpoint, the same at any world
// size (it is per tensor, not per shard); a checkpoint without the list (every one before)
// loads with every tensor at the optimizer's step.
TEST(EngineCheckpointTest, TensorStepsAreRestoredAtAnyWorldSizeAndDefaultToTheJobsStep) {
  for (const int64_t world_size : {1, 3}) {
    const sharding::ShardPlan plan = TestPlan(world_size);
    comm::InMemoryStore store;
    const absl::Status status = comm::testing::RunOnRankThreads(
        static_cast<int>(world_size), [&](int rank) -> absl::Status {
          comm::GlooCommunicatorOptions options;
          options.rank = rank;
          options.world_size = static_cast<int>(world_size);
          options.store = &store;
          ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                              comm::GlooCommunicator::Create(options));
          ZS_ASSIGN_OR_RETURN(
              std::unique_ptr<Engine> engine,
              Engine::Create(plan, rank, AdamWConfig(EngineMode::kZero2), communicator.get()));
          auto zeros = [](const Engine::SavedFragment&, absl::Span<char> out) {
            std::fill(out.begin(), out.end(), 0);
            return absl::OkStatus();
          };
          Engine::SavedScalars scalars;
          scalars.optimizer_step = 9;
          for (int64_t t = 0; t < plan.num_tensors(); ++t)
            scalars.tensor_steps.push_back(9 - t % 3);
          ZS_RETURN_IF_ERROR(engine->RestoreState(scalars, zeros));
          for (int64_t t = 0; t < plan.num_tensors(); ++t) {
            EXPECT_EQ(engine->tensor_step(t), 9 - t % 3) << "tensor " << t;
          }
          // Saved again as they are.
          EXPECT_EQ(engine->scalars().tensor_steps, scalars.tensor_steps);
          scalars.tensor_steps.clear();
          ZS_RETURN_IF_ERROR(engine->RestoreState(scalars, zeros));
          for (int64_t t = 0; t < plan.num_tensors(); ++t) EXPECT_EQ(engine->tensor_step(t), 9);
          EXPECT_TRUE(engine->scalars().tensor_steps.empty());
          return absl::OkStatus();
        });
    EXPECT_TRUE(status.ok()) << status;
  }
}

}  // namespace
}  // namespace zeroshard::engine
