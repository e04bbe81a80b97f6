// LoadFullState: engines of a running group restore their shards from a full state file (an
// attached trainer's torch-format load_state_dict), or every rank refuses a file that lacks a
// range and keeps its state. Threads as ranks over Gloo (TCP loopback).
#include "worker/daemon/checkpoint_loader.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/safetensors.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/workloads/workload.h"

namespace zeroshard::worker {
namespace {

constexpr int kWorldSize = 2;
const char* const kArrays[] = {"param", "exp_avg", "exp_avg_sq"};

std::vector<sharding::TensorSpec> TestTensors() {
  std::vector<sharding::TensorSpec> tensors;
  for (const auto& [name, elements] :
       {std::pair<const char*, int64_t>{"0.weight", 1500}, {"0.bias", 7}, {"2.weight", 2100}}) {
    sharding::TensorSpec spec;
    spec.name = name;
    spec.shape = {elements};
    spec.num_elements = elements;
    tensors.push_back(spec);
  }
  return tensors;
}

sharding::ShardPlan TestPlan() {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(TestTensors(), kWorldSize, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// A value no other (array, tensor, element) has, exact in fp32.
float FileValue(int array, int64_t tensor, int64_t element) {
  return static_cast<float>(array * 100000 + tensor * 10000 + element) * 0.5f;
}

// Writes every array of kArrays whole, except `left_out` ("<state>/<tensor>"), and returns the
// path.
std::string WriteFullStateFile(const std::string& name, const std::string& left_out = "") {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  std::vector<checkpoint::TensorDecl> declarations;
  std::vector<float> data;
  for (int a = 0; a < 3; ++a) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      const std::string key = absl::StrCat(kArrays[a], "/", tensors[t].name);
      if (key == left_out) continue;
      declarations.push_back({key, checkpoint::SafetensorsDType::kF32, {tensors[t].num_elements}});
      for (int64_t e = 0; e < tensors[t].num_elements; ++e) {
        data.push_back(FileValue(a, static_cast<int64_t>(t), e));
      }
    }
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsWriter>> writer =
      checkpoint::SafetensorsWriter::Create(path, std::move(declarations), {});
  EXPECT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE((*writer)->Append(data.data(), data.size() * sizeof(float)).ok());
  EXPECT_TRUE((*writer)->Finish().ok());
  return path;
}

using Engine = engine::Engine;

struct RankOutcome {
  absl::Status load;
  int64_t optimizer_step = 0;
  // Every saved fragment's values after the load, and every tensor's gathered parameters.
  std::vector<std::vector<float>> fragments;
  std::vector<Engine::SavedFragment> fragment_ranges;
  std::vector<std::vector<float>> parameters;
};

// Two ranks: initialise, take one step, then LoadFullState(path) between steps.
std::vector<RankOutcome> LoadOnTwoRanks(const std::string& path, int64_t optimizer_step) {
  const sharding::ShardPlan plan = TestPlan();
  comm::InMemoryStore store;
  std::vector<RankOutcome> outcomes(kWorldSize);
  const absl::Status status = comm::testing::RunOnRankThreads(kWorldSize, [&](int rank) {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = kWorldSize;
    options.store = &store;
    options.rendezvous_timeout = absl::Seconds(30);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                        comm::GlooCommunicator::Create(options));
    engine::EngineConfig config;
    config.mode = engine::EngineMode::kZero2;
    config.optimizer.kind = kernels::OptimizerKind::kAdamW;
    config.optimizer.lr = 1e-2;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(plan, rank, config, communicator.get()));
    ZS_RETURN_IF_ERROR(engine->InitializeParameters([](int64_t t, absl::Span<float> out) {
      for (size_t e = 0; e < out.size(); ++e) out[e] = 0.25f * static_cast<float>(t + 1);
      return absl::OkStatus();
    }));
    // A step first, so that the load replaces state an update wrote.
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      const std::vector<float> gradient(plan.tensors()[t].num_elements, 0.125f);
      ZS_RETURN_IF_ERROR(workloads::CopyGradientToSink(*engine, t, gradient));
    }
    ZS_RETURN_IF_ERROR(engine->Step(1.0).status());
    FullStateLoadOptions load;
    load.path = path;
    load.optimizer_step = optimizer_step;
    load.rank = rank;
    load.world_size = kWorldSize;
    load.store_prefix = "test-load/";
    load.agreement_timeout = absl::Seconds(30);
    RankOutcome& outcome = outcomes[rank];
    outcome.load = LoadFullState(load, plan, *engine, store);
    outcome.optimizer_step = engine->optimizer_step();
    std::vector<char> staging(engine->SavedBytes());
    ZS_RETURN_IF_ERROR(engine->CopyStateTo(absl::MakeSpan(staging)).status());
    for (const Engine::SavedFragment& fragment : engine->SavedFragments()) {
      std::vector<float> values(fragment.end - fragment.begin);
      std::memcpy(values.data(), staging.data() + fragment.staging_offset, fragment.bytes());
      outcome.fragments.push_back(std::move(values));
      outcome.fragment_ranges.push_back(fragment);
    }
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      ZS_ASSIGN_OR_RETURN(std::vector<float> values, engine->ParametersOnHost(t));
      outcome.parameters.push_back(std::move(values));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return outcomes;
}

int ArrayIndex(const std::string& state) {
  for (int a = 0; a < 3; ++a) {
    if (state == kArrays[a]) return a;
  }
  return -1;
}

TEST(LoadFullStateTest, EveryRankRestoresItsShardAndGathersTheParameters) {
  const std::vector<RankOutcome> outcomes =
      LoadOnTwoRanks(WriteFullStateFile("full.safetensors"), /*optimizer_step=*/7);
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(kWorldSize));
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const RankOutcome& outcome = outcomes[rank];
    ASSERT_TRUE(outcome.load.ok()) << "rank " << rank << ": " << outcome.load;
    EXPECT_EQ(outcome.optimizer_step, 7);
    ASSERT_FALSE(outcome.fragments.empty());
    for (size_t i = 0; i < outcome.fragments.size(); ++i) {
      const Engine::SavedFragment& range = outcome.fragment_ranges[i];
      const int array = ArrayIndex(range.state);
      ASSERT_GE(array, 0) << range.state;
      for (int64_t e = range.begin; e < range.end; ++e) {
        ASSERT_EQ(outcome.fragments[i][e - range.begin], FileValue(array, range.tensor, e))
            << "rank " << rank << " " << range.state << " tensor " << range.tensor << " element "
            << e;
      }
    }
    for (size_t t = 0; t < outcome.parameters.size(); ++t) {
      for (size_t e = 0; e < outcome.parameters[t].size(); ++e) {
        ASSERT_EQ(outcome.parameters[t][e],
                  FileValue(0, static_cast<int64_t>(t), static_cast<int64_t>(e)))
            << "rank " << rank << " tensor " << t << " element " << e;
      }
    }
  }
}

TEST(LoadFullStateTest, EveryRankRefusesAFileThatLacksATensorAndKeepsItsState) {
  const std::vector<RankOutcome> outcomes = LoadOnTwoRanks(
      WriteFullStateFile("partial.safetensors", "exp_avg_sq/2.weight"), /*optimizer_step=*/7);
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(kWorldSize));
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const RankOutcome& outcome = outcomes[rank];
    EXPECT_TRUE(absl::IsFailedPrecondition(outcome.load)) << outcome.load;
    EXPECT_NE(outcome.load.message().find("no tensor exp_avg_sq/2.weight"), std::string::npos)
        << outcome.load;
    // The state the step wrote: one update applied, the parameters not the file's.
    EXPECT_EQ(outcome.optimizer_step, 1);
    for (size_t t = 0; t < outcome.parameters.size(); ++t) {
      EXPECT_NE(outcome.parameters[t][0], FileValue(0, static_cast<int64_t>(t), 0));
    }
  }
}

}  // namespace
}  // namespace zeroshard::worker
