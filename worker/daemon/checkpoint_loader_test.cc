// LoadFullState: engines of a running group restore their shards from a full state file (an
// attached trainer's torch-format load_state_dict), or every rank refuses a file that lacks a
// range and keeps its state. LoadCheckpoint on a hostile volume: only the job's own checkpoints
// (unless one is named), no link followed, newest by (generation, step). Threads as ranks over
// Gloo (TCP loopback).
#include "worker/daemon/checkpoint_loader.h"

#include <fcntl.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/test_checkpoints.h"
#include "checkpoint/test_hostile_storage.h"
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

// One rank's load into its engine (between steps); what it returns is the rank's outcome.load.
using LoadFn = std::function<absl::Status(int rank, const sharding::ShardPlan& plan,
                                          engine::Engine& engine, comm::Store& store)>;

// Two ranks: initialise, take one step, then `load` between steps.
std::vector<RankOutcome> RunOnTwoRanks(const LoadFn& load_fn) {
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
    RankOutcome& outcome = outcomes[rank];
    outcome.load = load_fn(rank, plan, *engine, store);
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

// Two ranks: initialise, take one step, then LoadFullState(path) between steps.
std::vector<RankOutcome> LoadOnTwoRanks(const std::string& path, int64_t optimizer_step) {
  return RunOnTwoRanks([&](int rank, const sharding::ShardPlan& plan, engine::Engine& engine,
                           comm::Store& store) {
    // Each rank's trainer opens the file and passes it.
    absl::StatusOr<checkpoint::File> file =
        checkpoint::File::FromPassedDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC), path);
    if (!file.ok()) return file.status();
    FullStateLoadOptions load;
    load.path = path;
    load.optimizer_step = optimizer_step;
    load.rank = rank;
    load.world_size = kWorldSize;
    load.store_prefix = "test-load/";
    load.agreement_timeout = absl::Seconds(30);
    return LoadFullState(load, *std::move(file), plan, engine, store);
  });
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

// ---- LoadCheckpoint on a hostile volume ----

constexpr char kJobId[] = "job-000042";
constexpr char kJobDir[] = "job";

int TensorIndex(absl::string_view name) {
  const std::vector<sharding::TensorSpec> tensors = TestTensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].name == name) return static_cast<int>(t);
  }
  return -1;
}

// The value a checkpoint of `step` holds: which checkpoint a rank loaded shows in its state.
float CheckpointValue(int64_t step, int array, int64_t tensor, int64_t element) {
  return static_cast<float>(step) * 100.0f + FileValue(array, tensor, element) * 0.001f;
}

// Writes the rank files of a one-rank checkpoint of the test model at `step` (AdamW, fp32) into
// `step_dir` (a path the test trusts) and returns the manifest that commits them.
v1::CheckpointManifest WriteCheckpointFiles(const std::string& step_dir, int64_t step,
                                            int64_t generation, const std::string& job_id) {
  checkpoint::testing::TestCheckpointSpec spec;
  spec.job_id = job_id;
  spec.step = step;
  spec.generation = generation;
  spec.world_size = 1;
  spec.tensors = TestTensors();
  for (const char* state : kArrays) spec.states.push_back({state, v1::FLOAT32});
  absl::StatusOr<std::vector<checkpoint::WrittenFile>> files =
      checkpoint::testing::WriteTestShardFiles(
          step_dir, spec, [&](absl::string_view state, absl::string_view tensor, int64_t e) {
            return CheckpointValue(step, ArrayIndex(std::string(state)), TensorIndex(tensor), e);
          });
  EXPECT_TRUE(files.ok()) << files.status();
  sharding::ShardPlanOptions options;
  options.bucket_elems = spec.bucket_elems;
  return checkpoint::testing::TestManifest(
      spec, sharding::ShardPlan::Create(spec.tensors, 1, options)->layout_hash(), *files);
}

checkpoint::Directory Root(const std::string& path) {
  absl::StatusOr<checkpoint::Directory> root = checkpoint::Directory::OpenRoot(path);
  EXPECT_TRUE(root.ok()) << root.status();
  return *std::move(root);
}

// A committed checkpoint in <root>/job.
void Commit(const std::string& root, int64_t step, int64_t generation = 1,
            const std::string& job_id = kJobId) {
  const std::string step_dir =
      checkpoint::StepDir(checkpoint::JobCheckpointDir(root, kJobDir), step);
  const absl::Status committed = checkpoint::WriteManifest(
      Root(root), kJobDir, WriteCheckpointFiles(step_dir, step, generation, job_id));
  ASSERT_TRUE(committed.ok()) << committed;
}

struct CheckpointLoadOutcome {
  std::vector<RankOutcome> ranks;
  std::vector<absl::StatusOr<LoadedCheckpoint>> loaded;
};

// Both ranks load with `options` (rank and world size filled in).
CheckpointLoadOutcome LoadCheckpointOnTwoRanks(const CheckpointLoadOptions& options) {
  CheckpointLoadOutcome outcome;
  outcome.loaded.assign(kWorldSize, absl::UnknownError("not run"));
  outcome.ranks = RunOnTwoRanks(
      [&](int rank, const sharding::ShardPlan& plan, engine::Engine& engine, comm::Store& store) {
        CheckpointLoadOptions load = options;
        load.rank = rank;
        load.world_size = kWorldSize;
        load.optimizer = v1::ADAMW;
        load.param_dtype = v1::FLOAT32;
        load.agreement_timeout = absl::Seconds(30);
        outcome.loaded[rank] = LoadCheckpoint(load, plan, engine, store);
        return outcome.loaded[rank].status();
      });
  return outcome;
}

// Every rank loaded the checkpoint of `step`: its step, optimizer step and every value.
void ExpectLoaded(const CheckpointLoadOutcome& outcome, int64_t step) {
  ASSERT_EQ(outcome.ranks.size(), static_cast<size_t>(kWorldSize));
  for (int rank = 0; rank < kWorldSize; ++rank) {
    ASSERT_TRUE(outcome.loaded[rank].ok())
        << "rank " << rank << ": " << outcome.loaded[rank].status();
    EXPECT_EQ(outcome.loaded[rank]->step, step);
    EXPECT_EQ(outcome.ranks[rank].optimizer_step, step);
    for (size_t i = 0; i < outcome.ranks[rank].fragments.size(); ++i) {
      const Engine::SavedFragment& range = outcome.ranks[rank].fragment_ranges[i];
      for (int64_t e = range.begin; e < range.end; ++e) {
        ASSERT_EQ(outcome.ranks[rank].fragments[i][e - range.begin],
                  CheckpointValue(step, ArrayIndex(range.state), range.tensor, e))
            << "rank " << rank << " " << range.state << " tensor " << range.tensor;
      }
    }
  }
}

std::string PassedOver(const LoadedCheckpoint& loaded) {
  return absl::StrJoin(loaded.passed_over, "\n");
}

CheckpointLoadOptions JobLoad(const std::string& root, int64_t max_step) {
  CheckpointLoadOptions load;
  load.root = root;
  load.job_dir = kJobDir;
  load.job_id = kJobId;
  load.max_step = max_step;
  load.store_prefix = absl::StrCat("resume-", max_step, "/");
  return load;
}

// Issue 24, item 2: a resume loads only its own job's checkpoints; another job's in the same
// directory is reported and never loaded (today's loader resumes from step 20 of job-000007: this
// test fails there). A trainer's load_state_dict that names that checkpoint explicitly loads it.
TEST(LoadCheckpointTest, OnlyTheJobsOwnCheckpointsUnlessOneIsNamed) {
  const std::string root = checkpoint::testing::MakeTempDir("own_job");
  Commit(root, 10);
  Commit(root, 20, 1, "job-000007");
  const CheckpointLoadOutcome resumed = LoadCheckpointOnTwoRanks(JobLoad(root, 20));
  ExpectLoaded(resumed, 10);
  const std::string passed_over = PassedOver(*resumed.loaded[0]);
  EXPECT_TRUE(absl::StrContains(passed_over, "belongs to job \"job-000007\", not to job-000042"))
      << passed_over;

  absl::StatusOr<NamedCheckpoint> named =
      LocateNamedCheckpoint(root,
                            checkpoint::ManifestPath(checkpoint::StepDir(
                                checkpoint::JobCheckpointDir(root, kJobDir), 20)),
                            UniqueFd());
  ASSERT_TRUE(named.ok()) << named.status();
  CheckpointLoadOptions load;
  load.root = named->root;
  load.job_dir = named->job_dir;
  load.job_id = std::nullopt;  // named explicitly
  load.min_step = load.max_step = named->step;
  load.store_prefix = "named/";
  ExpectLoaded(LoadCheckpointOnTwoRanks(load), 20);
}

// Issue 24, item 1, on a worker: links in the job directory, to a step directory or to a shard
// file elsewhere holding a valid checkpoint of this job, are refused and reported, never
// followed: the resume falls back to the newest checkpoint that is really there. Today's loader
// follows them (it loads step 30 from outside the root): this test fails there.
TEST(LoadCheckpointTest, LinksAreRefusedNeverFollowed) {
  const std::string root = checkpoint::testing::MakeTempDir("links");
  const std::string outside = checkpoint::testing::MakeTempDir("links_outside");
  const std::string job = checkpoint::JobCheckpointDir(root, kJobDir);
  Commit(root, 10);
  Commit(root, 20);
  // Step 20's file: a link to a copy of itself outside (same bytes: following it would pass).
  const std::string shard = checkpoint::StepDir(job, 20) + "/" + checkpoint::ShardFileName(0, 1);
  const std::string copy = outside + "/copy.safetensors";
  std::filesystem::copy_file(shard, copy);
  std::filesystem::remove(shard);
  std::filesystem::create_symlink(copy, shard);
  // Step 30: a link to a valid checkpoint of this job outside the root.
  const std::string elsewhere = checkpoint::StepDir(outside, 30);
  ASSERT_TRUE(
      checkpoint::WriteManifest(Root(outside), "", WriteCheckpointFiles(elsewhere, 30, 1, kJobId))
          .ok());
  std::filesystem::create_directory_symlink(elsewhere, checkpoint::StepDir(job, 30));
  const auto before = checkpoint::testing::SnapshotDirectory(elsewhere);

  const CheckpointLoadOutcome resumed = LoadCheckpointOnTwoRanks(JobLoad(root, 30));
  ExpectLoaded(resumed, 10);
  const std::string passed_over = PassedOver(*resumed.loaded[0]);
  EXPECT_TRUE(absl::StrContains(passed_over, checkpoint::StepDir(job, 30) +
                                                 " is a symbolic link, where a "
                                                 "directory is expected: refused"))
      << passed_over;
  EXPECT_TRUE(absl::StrContains(passed_over, shard + " is a symbolic link")) << passed_over;
  EXPECT_EQ(checkpoint::testing::SnapshotDirectory(elsewhere), before);

  // The job directory itself a link: nothing is loaded, and the error names it.
  const std::string root2 = checkpoint::testing::MakeTempDir("links_job");
  std::filesystem::create_directory_symlink(job, checkpoint::JobCheckpointDir(root2, kJobDir));
  const CheckpointLoadOutcome refused = LoadCheckpointOnTwoRanks(JobLoad(root2, 30));
  for (int rank = 0; rank < kWorldSize; ++rank) {
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.loaded[rank].status()))
        << refused.loaded[rank].status();
    EXPECT_TRUE(
        absl::StrContains(refused.loaded[rank].status().message(),
                          checkpoint::JobCheckpointDir(root2, kJobDir) + " is a symbolic link"))
        << refused.loaded[rank].status();
  }
}

// Issue 24, item 5: "newest" is (generation, step), as the coordinator's latest_checkpoint.
// Generation 2 resumed from step 20 and committed step 30 after generation 1 had committed step
// 40: the newest at or before step 40 is generation 2's step 30. Today's loader takes step 40:
// this test fails there.
TEST(LoadCheckpointTest, NewestIsByGenerationThenStep) {
  const std::string root = checkpoint::testing::MakeTempDir("generations");
  Commit(root, 20, /*generation=*/1);
  Commit(root, 40, /*generation=*/1);
  Commit(root, 30, /*generation=*/2);
  ExpectLoaded(LoadCheckpointOnTwoRanks(JobLoad(root, 40)), 30);
}

TEST(LoadCheckpointTest, LocateNamedCheckpointWalksTheRootOrReadsThroughThePassedDescriptor) {
  absl::StatusOr<NamedCheckpoint> under = LocateNamedCheckpoint(
      "/ckpt", "/ckpt/team/job-1/step-000000000020/manifest.json", UniqueFd());
  ASSERT_TRUE(under.ok()) << under.status();
  EXPECT_EQ(under->root, "/ckpt");
  EXPECT_EQ(under->job_dir, "team/job-1");
  EXPECT_EQ(under->step, 20);
  EXPECT_EQ(under->step_dir, nullptr);
  // Outside the root, however it is spelled, a path alone is refused: the worker opens nothing
  // there on a trainer's word (before issue 24 it opened /home/me/copy and /etc).
  for (const char* outside : {"/home/me/copy/step-000000000020/manifest.json",
                              "/ckpt/../etc/step-000000000020/manifest.json"}) {
    const absl::Status refused = LocateNamedCheckpoint("/ckpt", outside, UniqueFd()).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "outside the worker's checkpoint root"))
        << refused;
  }
  // With the step directory's descriptor, the path only names it.
  const std::string copy = checkpoint::testing::MakeTempDir("named_copy");
  const absl::StatusOr<NamedCheckpoint> passed =
      LocateNamedCheckpoint("/ckpt", "/home/me/copy/step-000000000020/manifest.json",
                            UniqueFd(::open(copy.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
  ASSERT_TRUE(passed.ok()) << passed.status();
  ASSERT_NE(passed->step_dir, nullptr);
  EXPECT_EQ(passed->step_dir->path(), "/home/me/copy/step-000000000020");
  EXPECT_EQ(passed->step, 20);
  // A descriptor of something else than a directory is refused.
  const std::string file = copy + "/not-a-directory";
  std::ofstream(file) << "x";
  const absl::Status not_a_directory =
      LocateNamedCheckpoint("/ckpt", "/home/me/copy/step-000000000020/manifest.json",
                            UniqueFd(::open(file.c_str(), O_RDONLY | O_CLOEXEC)))
          .status();
  EXPECT_EQ(not_a_directory.code(), absl::StatusCode::kInvalidArgument) << not_a_directory;
  EXPECT_TRUE(absl::StrContains(not_a_directory.message(), "not a directory")) << not_a_directory;
  for (const char* bad :
       {"relative/step-000000000020/manifest.json", "/ckpt/job/step-20/manifest.json",
        "/ckpt/job/step-000000000020/x.json"}) {
    EXPECT_EQ(LocateNamedCheckpoint("/ckpt", bad, UniqueFd()).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// Issue 24, decided detail: a checkpoint outside the root (a copy the trainer made) reaches the
// worker as the descriptor of its step directory, opened by the trainer; every rank reads
// through its own, and a link inside it is still refused, never followed.
TEST(LoadCheckpointTest, ACopyOutsideTheRootLoadsThroughThePassedDescriptor) {
  const std::string outside = checkpoint::testing::MakeTempDir("passed_copy");
  ASSERT_TRUE(checkpoint::WriteManifest(
                  Root(outside), "",
                  WriteCheckpointFiles(checkpoint::StepDir(outside, 30), 30, 1, "job-000007"))
                  .ok());
  auto load_passed = [&](const std::string& step_dir) {
    CheckpointLoadOptions load;
    load.named_step_dir =
        std::make_shared<const checkpoint::Directory>(*checkpoint::Directory::FromPassedDescriptor(
            ::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), step_dir));
    load.job_id = std::nullopt;  // named explicitly: another job's
    load.min_step = load.max_step = 30;
    load.store_prefix = absl::StrCat("passed-", step_dir.size(), "/");
    return LoadCheckpointOnTwoRanks(load);
  };
  ExpectLoaded(load_passed(checkpoint::StepDir(outside, 30)), 30);

  // The shard file a link to a copy of itself: refused by every rank, named.
  const std::string linked = checkpoint::testing::MakeTempDir("passed_link");
  const std::string step_dir = checkpoint::StepDir(linked, 30);
  std::filesystem::copy(checkpoint::StepDir(outside, 30), step_dir);
  const std::string shard = step_dir + "/" + checkpoint::ShardFileName(0, 1);
  std::filesystem::remove(shard);
  std::filesystem::create_symlink(
      checkpoint::StepDir(outside, 30) + "/" + checkpoint::ShardFileName(0, 1), shard);
  const CheckpointLoadOutcome refused = load_passed(step_dir);
  for (int rank = 0; rank < kWorldSize; ++rank) {
    EXPECT_TRUE(absl::IsDataLoss(refused.loaded[rank].status())) << refused.loaded[rank].status();
    EXPECT_TRUE(
        absl::StrContains(refused.loaded[rank].status().message(), shard + " is a symbolic link"))
        << refused.loaded[rank].status();
  }
}

// Issue 37: a step directory copied under a name of the user's (not step-<step>) loads through
// its passed descriptor, its step read from its manifest. Fails before the fix:
// LocateNamedCheckpoint refused it ("is not the absolute path of a checkpoint's manifest.json").
TEST(LoadCheckpointTest, APassedStepDirectoryOfAnyNameLoads) {
  const std::string outside = checkpoint::testing::MakeTempDir("renamed_copy");
  ASSERT_TRUE(checkpoint::WriteManifest(
                  Root(outside), "",
                  WriteCheckpointFiles(checkpoint::StepDir(outside, 30), 30, 1, "job-000007"))
                  .ok());
  const std::string renamed = outside + "/my-copy";
  std::filesystem::rename(checkpoint::StepDir(outside, 30), renamed);
  const absl::StatusOr<NamedCheckpoint> named =
      LocateNamedCheckpoint("/ckpt", renamed + "/manifest.json",
                            UniqueFd(::open(renamed.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->step, 30);
  CheckpointLoadOptions load;
  load.named_step_dir = named->step_dir;
  load.job_id = std::nullopt;
  load.min_step = load.max_step = named->step;
  load.store_prefix = "renamed/";
  ExpectLoaded(LoadCheckpointOnTwoRanks(load), 30);

  // Without a descriptor the name is needed (the path is walked from the root), and says so; a
  // passed directory of another name without a manifest is refused, naming the path.
  const absl::Status unnamed =
      LocateNamedCheckpoint("/ckpt", "/ckpt/job/my-copy/manifest.json", UniqueFd()).status();
  EXPECT_EQ(unnamed.code(), absl::StatusCode::kInvalidArgument) << unnamed;
  EXPECT_TRUE(absl::StrContains(unnamed.message(), "step-<12-digit step> directory")) << unnamed;
  const std::string empty = checkpoint::testing::MakeTempDir("renamed_empty");
  const absl::Status no_manifest =
      LocateNamedCheckpoint("/ckpt", empty + "/manifest.json",
                            UniqueFd(::open(empty.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)))
          .status();
  EXPECT_EQ(no_manifest.code(), absl::StatusCode::kInvalidArgument) << no_manifest;
  EXPECT_TRUE(absl::StrContains(no_manifest.message(), empty + "/manifest.json")) << no_manifest;
}

}  // namespace
}  // namespace zeroshard::worker
