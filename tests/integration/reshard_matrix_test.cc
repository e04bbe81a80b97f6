// Issue 12's reshard matrix with real processes: for every (W, W') in {1,2,3,4}^2 a job trains on
// W workers, loses workers after its checkpoint at step C, resumes on W' from C and ends close to
// (for W == W': bitwise equal to) uninterrupted runs. Issue 38: zero3 cells, and at
// the same W a zero3 job's export and checkpoint equal the zero2 job's bit for bit.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "client/export_file.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(120);
// The checkpoint C the next generation resumes from, and the steps it then runs. The only
// checkpoint after C is the final one, so the membership change may land anywhere in those 20
// steps.
constexpr int64_t kResumeStep = 20;
constexpr int64_t kSteps = kResumeStep + 20;
constexpr int kMaxWorkers = 4;

LocalClusterOptions FastHeartbeats() {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(200);
  options.missed_heartbeats = 3;
  // Generation 2 must hold every survivor. They are back within a few hundred milliseconds of a
  // kill, but a loaded machine can stretch that past the default wait (one period). The wait ends
  // as soon as they are: the killed ranks are named by the survivors or are dead by their lease.
  options.extra_coordinator_flags = {"--regroup_wait=10s"};
  return options;
}

// recovery_test's model; any W in 1..4 divides the global batch, so the scheduler takes every
// idle worker up to 4.
v1::JobSpec MatrixSpec(const std::string& name, v1::Mode mode) {
  v1::JobSpec spec;
  spec.set_name(name);
  for (int64_t size : {128, 512, 512, 128}) spec.mutable_workload()->add_layer_sizes(size);
  spec.mutable_workload()->set_dataset_size(4096);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(1e-3);
  spec.set_mode(mode);
  spec.set_min_workers(1);
  spec.set_max_workers(kMaxWorkers);
  spec.set_global_batch(96);
  spec.set_steps(kSteps);
  spec.set_seed(3);
  spec.mutable_checkpoint()->set_every_steps(kResumeStep);
  spec.mutable_checkpoint()->set_keep(3);
  spec.set_max_attempts(5);
  return spec;
}

// One exported tensor, by its torch name.
struct NamedTensor {
  std::string name;
  std::vector<float> values;
};

// The job's fp32 parameters at checkpoint `step` (its final state without one), through the
// export RPC that `zeroshard export` uses.
absl::StatusOr<std::vector<NamedTensor>> ExportParameters(LocalCluster& cluster,
                                                          const std::string& job_id,
                                                          std::optional<int64_t> step) {
  const std::string path =
      absl::StrCat(cluster.base_dir(), "/", job_id, "-",
                   step.has_value() ? absl::StrCat(*step) : "final", ".safetensors");
  absl::StatusOr<client::ExportSummary> exported =
      client::ExportToFile(cluster.client(), job_id, step, path);
  if (!exported.ok()) return exported.status();
  absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsReader>> file =
      checkpoint::SafetensorsReader::Open(path);
  if (!file.ok()) return file.status();
  std::vector<NamedTensor> tensors;
  for (const checkpoint::TensorInfo& info : (*file)->tensors()) {
    if (info.dtype != checkpoint::SafetensorsDType::kF32) {
      return absl::InternalError(absl::StrCat(path, ": ", info.name, " is not F32"));
    }
    NamedTensor& tensor = tensors.emplace_back();
    tensor.name = info.name;
    tensor.values.resize(info.num_bytes() / sizeof(float));
    absl::Status read = (*file)->ReadTensorBytes(info, 0, tensor.values.data(), info.num_bytes());
    if (!read.ok()) return read;
  }
  file->reset();
  std::filesystem::remove(path);
  return tensors;
}

void DeleteCheckpoints(const LocalCluster& cluster, const v1::Job& job) {
  std::error_code ignored;
  std::filesystem::remove_all(
      checkpoint::JobCheckpointDir(cluster.checkpoint_root(), job.spec().checkpoint().dir()),
      ignored);
}

// What a committed checkpoint holds, every state of every tensor as stored (this fp32 job stores
// every state in fp32), keyed "state/tensor", with the header fields a resume checks.
struct CheckpointContents {
  uint64_t layout_hash = 0;
  int64_t optimizer_step = 0;
  std::map<std::string, std::vector<float>> states;
};

absl::StatusOr<CheckpointContents> ReadCheckpoint(const LocalCluster& cluster, const v1::Job& job,
                                                  int64_t step) {
  absl::StatusOr<checkpoint::Directory> root =
      checkpoint::Directory::OpenRoot(cluster.checkpoint_root());
  if (!root.ok()) return root.status();
  absl::StatusOr<checkpoint::CheckpointListing> listing =
      checkpoint::ListCheckpoints(*root, job.spec().checkpoint().dir(), job.id());
  if (!listing.ok()) return listing.status();
  for (checkpoint::CommittedCheckpoint& committed : listing->committed) {
    if (committed.step != step) continue;
    absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
        checkpoint::CheckpointReader::Open(std::move(committed));
    if (!reader.ok()) return reader.status();
    CheckpointContents contents;
    contents.layout_hash = (*reader)->header().layout_hash();
    contents.optimizer_step = (*reader)->header().optimizer_step();
    for (const std::string& state : (*reader)->header().states()) {
      for (const v1::CheckpointTensor& tensor : (*reader)->header().tensors()) {
        int64_t elements = 1;
        for (int64_t dim : tensor.shape()) elements *= dim;
        std::vector<float>& values = contents.states[absl::StrCat(state, "/", tensor.name())];
        values.resize(elements);
        absl::Status read = (*reader)->Read(state, tensor.name(), 0, elements, values.data(),
                                            values.size() * sizeof(float));
        if (!read.ok()) return read;
      }
    }
    return contents;
  }
  return absl::NotFoundError(absl::StrCat(job.id(), ": no committed checkpoint at step ", step));
}

struct Difference {
  double relative = 0.0;  // the largest over tensors of max|reference - other| / max|reference|
  std::string tensor;     // where it is
};

bool SameNamesAndSizes(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].name != b[t].name || a[t].values.size() != b[t].values.size()) return false;
  }
  return true;
}

// Per tensor, max |reference - other| / max |reference|: the largest over tensors (infinite for
// tensor lists that do not match).
Difference MaxRelativeDifference(const std::vector<NamedTensor>& reference,
                                 const std::vector<NamedTensor>& other) {
  if (!SameNamesAndSizes(reference, other)) {
    return {std::numeric_limits<double>::infinity(), "(other tensors)"};
  }
  Difference worst;
  for (size_t t = 0; t < reference.size(); ++t) {
    double diff = 0.0;
    double scale = 0.0;
    for (size_t e = 0; e < reference[t].values.size(); ++e) {
      diff = std::max(diff, std::fabs(double{reference[t].values[e]} - double{other[t].values[e]}));
      scale = std::max(scale, std::fabs(double{reference[t].values[e]}));
    }
    const double relative = scale > 0.0 ? diff / scale : diff;
    if (relative >= worst.relative) worst = {relative, reference[t].name};
  }
  return worst;
}

bool BitwiseEqual(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  if (!SameNamesAndSizes(a, b)) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (std::memcmp(a[t].values.data(), b[t].values.data(), a[t].values.size() * sizeof(float)) !=
        0) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<v1::Job> WaitUntilEnded(LocalCluster& cluster, const std::string& job_id) {
  return cluster.WaitForJob(
      job_id, [](const v1::Job& job) { return IsFinalJobState(job.state()); }, kDeadline, "ended");
}

// An uninterrupted run at one W: its final parameters and those of its checkpoint at C (exported),
// and that checkpoint's contents.
struct ReferenceRun {
  std::vector<NamedTensor> final_params;
  std::vector<NamedTensor> params_at_resume_step;
  CheckpointContents checkpoint_at_resume_step;
};

absl::StatusOr<ReferenceRun> RunReference(v1::Mode mode, int world_size) {
  LocalCluster cluster(FastHeartbeats());
  LogTailsOnFailure log_tails(cluster);
  if (absl::Status started = cluster.Start(world_size); !started.ok()) return started;
  absl::StatusOr<v1::Job> submitted =
      cluster.client().SubmitJob(MatrixSpec(absl::StrCat("reference-w", world_size), mode));
  if (!submitted.ok()) return submitted.status();
  absl::StatusOr<v1::Job> ended = WaitUntilEnded(cluster, submitted->id());
  if (!ended.ok()) return ended.status();
  if (ended->state() != v1::SUCCEEDED || ended->generation() != 1 ||
      ended->worker_ids_size() != world_size) {
    return absl::InternalError(
        absl::StrCat("the ", v1::Mode_Name(mode), " reference at W = ", world_size,
                     " did not run uninterrupted: ", ended->ShortDebugString()));
  }
  // The engine ran the mode asked for: only zero3 has a gather pool.
  if ((ended->progress().memory().gather_pool_bytes() > 0) != (mode == v1::ZERO3)) {
    return absl::InternalError(absl::StrCat("the ", v1::Mode_Name(mode), " reference reported ",
                                            ended->progress().memory().ShortDebugString()));
  }
  ReferenceRun reference;
  absl::StatusOr<std::vector<NamedTensor>> final_params =
      ExportParameters(cluster, ended->id(), std::nullopt);
  if (!final_params.ok()) return final_params.status();
  reference.final_params = *std::move(final_params);
  absl::StatusOr<std::vector<NamedTensor>> at_resume_step =
      ExportParameters(cluster, ended->id(), kResumeStep);
  if (!at_resume_step.ok()) return at_resume_step.status();
  reference.params_at_resume_step = *std::move(at_resume_step);
  absl::StatusOr<CheckpointContents> contents = ReadCheckpoint(cluster, *ended, kResumeStep);
  if (!contents.ok()) return contents.status();
  reference.checkpoint_at_resume_step = *std::move(contents);
  DeleteCheckpoints(cluster, *ended);
  if (absl::Status stopped = cluster.StopAll(); !stopped.ok()) return stopped;
  return reference;
}

// One reference run per mode and W, shared by the pairs that start or resume at that W.
absl::StatusOr<const ReferenceRun*> ReferenceAt(v1::Mode mode, int world_size) {
  static auto& references = *new std::map<std::pair<v1::Mode, int>, ReferenceRun>();
  auto found = references.find({mode, world_size});
  if (found != references.end()) return &found->second;
  absl::StatusOr<ReferenceRun> run = RunReference(mode, world_size);
  if (!run.ok()) return run.status();
  return &references.emplace(std::make_pair(mode, world_size), *std::move(run)).first->second;
}

// How generation 1 (W ranks) becomes generation 2 (W' ranks): the highest ranks are killed with
// SIGKILL, all at once (one when W' >= W, else W - W'), and spares, started and IDLE before the
// kill, make up the rest. The next generation forms from every survivor plus the idle spares
// (job_manager.h, "Regrouping"), so it has exactly W' workers. With W = 1 the only rank is killed
// and generation 2 is the spares alone.
struct MembershipChange {
  int spares = 0;                 // workers started, and IDLE, before the kill
  std::vector<int> victim_ranks;  // ranks of generation 1 killed with SIGKILL, all at once
};

MembershipChange ChangeFor(int from, int to) {
  MembershipChange change;
  const int killed = std::max(1, from - to);
  for (int rank = from - killed; rank < from; ++rank) change.victim_ranks.push_back(rank);
  change.spares = to - (from - killed);
  return change;
}

// The "20 further steps match an uninterrupted run at W' within 1e-6" (per tensor,
// max|delta| / max|p|), as measured (docs/design.md, "Checkpoints: writing, committing,
// resuming"). From the same checkpoint C (bitwise the uninterrupted run's at W), 20 steps at W'
// end 1.4e-7..2.3e-7 from 20 steps at W: that holds. Against the uninterrupted run at W' from
// step 0, W != W' ends 9.0e-7..6.9e-6 away, above 1e-6 for every pair but 1 <-> 2, because the
// two runs differ before C: by 1.4e-6..9.7e-6 after their first step already (AdamW's first update,
// about lr * g / (|g| + eps), turns the reduction-order rounding of near-zero gradients into a
// good part of an update; 7e-6 and more for any pair with W = 3), 1.0e-6..7.8e-6 at C. The 20
// steps after the reshard end below that, so that comparison bounds what they add.
constexpr double kTolerance = 1e-6;

// One cell: a `mode` job on `from` workers resumes on `to` from its checkpoint at C, against
// uninterrupted `mode` runs at both world sizes.
void ResumesOnTheNewWorldSize(v1::Mode mode, int from, int to) {
  absl::StatusOr<const ReferenceRun*> reference_from = ReferenceAt(mode, from);
  ASSERT_TRUE(reference_from.ok()) << reference_from.status();
  absl::StatusOr<const ReferenceRun*> reference_to = ReferenceAt(mode, to);
  ASSERT_TRUE(reference_to.ok()) << reference_to.status();

  LocalCluster cluster(FastHeartbeats());
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.Start(from);
  ASSERT_TRUE(started.ok()) << started;
  absl::StatusOr<v1::Job> submitted =
      cluster.client().SubmitJob(MatrixSpec(absl::StrCat("reshard-", from, "-to-", to), mode));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<v1::Job> first = cluster.WaitForJob(
      submitted->id(), [](const v1::Job& job) { return job.state() == v1::RUNNING; }, kDeadline,
      "generation 1");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->worker_ids_size(), from);

  // Spares started now stay IDLE: the scheduler places only PENDING and RECOVERING jobs.
  const MembershipChange change = ChangeFor(from, to);
  std::vector<std::string> spares;
  for (int i = 0; i < change.spares; ++i) {
    spares.push_back(absl::StrCat("worker-", from + i));
    absl::StatusOr<int> spare = cluster.StartWorker(spares.back());
    ASSERT_TRUE(spare.ok()) << spare.status();
  }
  absl::Status spares_idle = cluster.WaitForWorkerStates(spares, v1::IDLE, absl::Seconds(30));
  ASSERT_TRUE(spares_idle.ok()) << spares_idle;
  std::vector<int> victims;
  for (int rank : change.victim_ranks) {
    absl::StatusOr<int> index = cluster.WorkerIndexOf(first->worker_ids(rank));
    ASSERT_TRUE(index.ok()) << index.status();
    victims.push_back(*index);
  }

  absl::StatusOr<v1::Job> checkpointed = cluster.WaitForJob(
      submitted->id(),
      [](const v1::Job& job) {
        return job.state() != v1::RUNNING || job.latest_checkpoint().step() >= kResumeStep;
      },
      kDeadline, absl::StrCat("the checkpoint at step ", kResumeStep));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  ASSERT_EQ(checkpointed->state(), v1::RUNNING) << "the job ended before the kill";
  ASSERT_EQ(checkpointed->latest_checkpoint().step(), kResumeStep) << "the kill came too late";
  for (int victim : victims) ASSERT_TRUE(cluster.KillWorker(victim, SIGKILL).ok());
  for (int victim : victims) {
    ASSERT_TRUE(cluster.WaitForWorkerExit(victim, absl::Seconds(10)).ok());
  }

  absl::StatusOr<v1::Job> ended = WaitUntilEnded(cluster, submitted->id());
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  ASSERT_EQ(ended->generation(), 2);
  ASSERT_EQ(ended->worker_ids_size(), to);
  // Every survivor and every spare.
  std::vector<std::string> expected_members;
  for (int rank = 0; rank < from; ++rank) {
    if (!absl::c_linear_search(change.victim_ranks, rank)) {
      expected_members.push_back(first->worker_ids(rank));
    }
  }
  for (const std::string& spare : spares) {
    absl::StatusOr<v1::WorkerInfo> info = cluster.FindWorker(spare);
    ASSERT_TRUE(info.ok()) << info.status();
    expected_members.push_back(info->id());
  }
  std::vector<std::string> members(ended->worker_ids().begin(), ended->worker_ids().end());
  std::sort(expected_members.begin(), expected_members.end());
  std::sort(members.begin(), members.end());
  EXPECT_EQ(members, expected_members);
  // Generation 2 starts on W' workers from checkpoint C and runs exactly the steps after it.
  std::vector<int64_t> resumed_steps;
  int generation_two_size = 0;
  std::string recovering_message;
  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  for (const v1::JobEvent& event : *events) {
    if (event.type() == v1::STATE_CHANGED && event.state() == v1::RECOVERING) {
      recovering_message = event.message();
    }
    if (event.type() == v1::GENERATION_STARTED && event.generation() == 2) {
      generation_two_size = event.worker_ids_size();
    }
    if (event.type() == v1::PROGRESS && event.generation() == 2) {
      resumed_steps.push_back(event.progress().step());
    }
  }
  EXPECT_EQ(generation_two_size, to);
  ASSERT_FALSE(resumed_steps.empty());
  const int64_t resumed_from = resumed_steps.front() - 1;
  EXPECT_EQ(resumed_from, kResumeStep);
  EXPECT_EQ(resumed_steps.size(), static_cast<size_t>(kSteps - kResumeStep));
  EXPECT_EQ(resumed_steps.back(), kSteps);
  EXPECT_TRUE(absl::StrContains(recovering_message,
                                absl::StrCat("resuming from the checkpoint at step ", kResumeStep)))
      << recovering_message;

  absl::StatusOr<std::vector<NamedTensor>> final_params =
      ExportParameters(cluster, ended->id(), std::nullopt);
  ASSERT_TRUE(final_params.ok()) << final_params.status();
  absl::StatusOr<std::vector<NamedTensor>> at_resume_step =
      ExportParameters(cluster, ended->id(), kResumeStep);
  ASSERT_TRUE(at_resume_step.ok()) << at_resume_step.status();
  DeleteCheckpoints(cluster, *ended);
  ASSERT_TRUE(SameNamesAndSizes((*reference_to)->final_params, *final_params));
  ASSERT_TRUE(SameNamesAndSizes((*reference_to)->params_at_resume_step, *at_resume_step));

  // Checkpoint C is what the uninterrupted run at W had at C.
  EXPECT_TRUE(BitwiseEqual((*reference_from)->params_at_resume_step, *at_resume_step));
  const Difference versus_to = MaxRelativeDifference((*reference_to)->final_params, *final_params);
  const Difference versus_to_at_resume_step =
      MaxRelativeDifference((*reference_to)->params_at_resume_step, *at_resume_step);
  const Difference versus_from =
      MaxRelativeDifference((*reference_from)->final_params, *final_params);
  std::fprintf(stderr,
               "%s W %d -> %d: resumed from step %lld; against the uninterrupted run at W' %.3g "
               "(%s; %.3g at step %lld), at W %.3g (%s)\n",
               v1::Mode_Name(mode).c_str(), from, to, static_cast<long long>(resumed_from),
               versus_to.relative, versus_to.tensor.c_str(), versus_to_at_resume_step.relative,
               static_cast<long long>(kResumeStep), versus_from.relative,
               versus_from.tensor.c_str());
  if (from == to) {
    EXPECT_TRUE(BitwiseEqual((*reference_to)->final_params, *final_params))
        << "max relative difference " << versus_to.relative << " in " << versus_to.tensor;
  } else {
    EXPECT_LE(versus_from.relative, kTolerance) << versus_from.tensor;
    EXPECT_LE(versus_to.relative, versus_to_at_resume_step.relative + kTolerance)
        << versus_to.tensor;
  }
  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

class ReshardMatrixTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ReshardMatrixTest, ResumesFromTheCheckpointOnTheNewWorldSize) {
  const auto [from, to] = GetParam();
  ResumesOnTheNewWorldSize(v1::ZERO2, from, to);
}

INSTANTIATE_TEST_SUITE_P(AllPairs, ReshardMatrixTest,
                         ::testing::Combine(::testing::Range(1, kMaxWorkers + 1),
                                            ::testing::Range(1, kMaxWorkers + 1)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return absl::StrCat("W", std::get<0>(info.param), "to",
                                               std::get<1>(info.param));
                         });

// Issue 38, row 6: zero3 checkpoints (the owned pieces in W-independent coordinates) resume on
// another W both ways: growing, shrinking, from and to W = 1, and W unchanged (bitwise). A few
// cells, not all 16: zero3 shares zero2's resharding path, and each costs about 3 s. Fails before
// the fix: mode ZERO3 was refused at submission ("not implemented yet").
class ReshardMatrixZero3Test : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ReshardMatrixZero3Test, ResumesFromTheCheckpointOnTheNewWorldSize) {
  const auto [from, to] = GetParam();
  ResumesOnTheNewWorldSize(v1::ZERO3, from, to);
}

INSTANTIATE_TEST_SUITE_P(SomePairs, ReshardMatrixZero3Test,
                         ::testing::Values(std::make_tuple(2, 3), std::make_tuple(3, 2),
                                           std::make_tuple(1, 4), std::make_tuple(4, 1),
                                           std::make_tuple(2, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return absl::StrCat("W", std::get<0>(info.param), "to",
                                               std::get<1>(info.param));
                         });

// Issue 38, row 6, job level: a job with JobSpec.resume_from starts from another, ended job's
// checkpoint C, whatever that job's mode and W were, and runs the steps after C. Same W: its end
// equals the uninterrupted run bitwise (zero2 and zero3 end bitwise alike, below); another W: as
// a recovery onto W' does (the cells above). Fails before the fix: no JobSpec field named another
// job's checkpoint, so nothing resumed across modes.
struct ModeChange {
  v1::Mode from_mode;
  int from;
  v1::Mode to_mode;
  int to;
};

class ResumeFromTest : public ::testing::TestWithParam<ModeChange> {};

TEST_P(ResumeFromTest, ResumesAnotherJobsCheckpointInAnotherModeAndWorldSize) {
  const ModeChange change = GetParam();
  absl::StatusOr<const ReferenceRun*> reference_from = ReferenceAt(change.from_mode, change.from);
  ASSERT_TRUE(reference_from.ok()) << reference_from.status();
  absl::StatusOr<const ReferenceRun*> reference_to = ReferenceAt(change.to_mode, change.to);
  ASSERT_TRUE(reference_to.ok()) << reference_to.status();

  LocalCluster cluster(FastHeartbeats());
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.Start(std::max(change.from, change.to));
  ASSERT_TRUE(started.ok()) << started;
  v1::JobSpec source_spec = MatrixSpec("source", change.from_mode);
  source_spec.set_min_workers(change.from);
  source_spec.set_max_workers(change.from);
  absl::StatusOr<v1::Job> source = cluster.client().SubmitJob(source_spec);
  ASSERT_TRUE(source.ok()) << source.status();

  // A job still running is no source: it prunes its checkpoints.
  v1::JobSpec spec = MatrixSpec("resumed", change.to_mode);
  spec.set_min_workers(change.to);
  spec.set_max_workers(change.to);
  spec.mutable_resume_from()->set_job_id(source->id());
  spec.mutable_resume_from()->set_step(kResumeStep);
  absl::StatusOr<v1::Job> early = cluster.client().SubmitJob(spec);
  ASSERT_FALSE(early.ok());
  EXPECT_TRUE(absl::StrContains(early.status().message(), "resume_from.job_id")) << early.status();

  absl::StatusOr<v1::Job> source_ended = WaitUntilEnded(cluster, source->id());
  ASSERT_TRUE(source_ended.ok()) << source_ended.status();
  ASSERT_EQ(source_ended->state(), v1::SUCCEEDED) << source_ended->message();

  // Another model is refused at submission, naming the field.
  v1::JobSpec other_model = spec;
  other_model.mutable_workload()->set_layer_sizes(1, 256);
  absl::StatusOr<v1::Job> refused = cluster.client().SubmitJob(other_model);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "workload: ")) << refused.status();

  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->resumed_from().job_id(), source->id());
  EXPECT_EQ(submitted->resumed_from().step(), kResumeStep);
  EXPECT_EQ(submitted->resumed_from().world_size(), change.from);
  absl::StatusOr<v1::Job> ended = WaitUntilEnded(cluster, submitted->id());
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  ASSERT_EQ(ended->generation(), 1);
  ASSERT_EQ(ended->worker_ids_size(), change.to);
  EXPECT_EQ((ended->progress().memory().gather_pool_bytes() > 0), change.to_mode == v1::ZERO3);
  // It ran exactly the steps after C.
  std::vector<int64_t> steps;
  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  for (const v1::JobEvent& event : *events) {
    if (event.type() == v1::PROGRESS) steps.push_back(event.progress().step());
  }
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), kResumeStep + 1);
  EXPECT_EQ(steps.size(), static_cast<size_t>(kSteps - kResumeStep));
  EXPECT_EQ(steps.back(), kSteps);

  absl::StatusOr<std::vector<NamedTensor>> final_params =
      ExportParameters(cluster, ended->id(), std::nullopt);
  ASSERT_TRUE(final_params.ok()) << final_params.status();
  // The source's checkpoint is untouched: C still exports as the uninterrupted run's.
  absl::StatusOr<std::vector<NamedTensor>> source_at_c =
      ExportParameters(cluster, source->id(), kResumeStep);
  ASSERT_TRUE(source_at_c.ok()) << source_at_c.status();
  EXPECT_TRUE(BitwiseEqual((*reference_from)->params_at_resume_step, *source_at_c));
  DeleteCheckpoints(cluster, *ended);
  DeleteCheckpoints(cluster, *source_ended);
  ASSERT_TRUE(SameNamesAndSizes((*reference_to)->final_params, *final_params));
  const Difference versus_from =
      MaxRelativeDifference((*reference_from)->final_params, *final_params);
  const Difference versus_to = MaxRelativeDifference((*reference_to)->final_params, *final_params);
  const Difference versus_to_at_resume_step = MaxRelativeDifference(
      (*reference_to)->params_at_resume_step, (*reference_from)->params_at_resume_step);
  std::fprintf(stderr,
               "resume_from %s W %d -> %s W %d: against the uninterrupted run at W' %.3g (%s; %.3g "
               "at C), at W %.3g (%s)\n",
               v1::Mode_Name(change.from_mode).c_str(), change.from,
               v1::Mode_Name(change.to_mode).c_str(), change.to, versus_to.relative,
               versus_to.tensor.c_str(), versus_to_at_resume_step.relative, versus_from.relative,
               versus_from.tensor.c_str());
  if (change.from == change.to) {
    EXPECT_TRUE(BitwiseEqual((*reference_to)->final_params, *final_params))
        << "max relative difference " << versus_to.relative << " in " << versus_to.tensor;
  } else {
    EXPECT_LE(versus_from.relative, kTolerance) << versus_from.tensor;
    EXPECT_LE(versus_to.relative, versus_to_at_resume_step.relative + kTolerance)
        << versus_to.tensor;
  }
  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

INSTANTIATE_TEST_SUITE_P(BothWays, ResumeFromTest,
                         ::testing::Values(ModeChange{v1::ZERO2, 2, v1::ZERO3, 2},
                                           ModeChange{v1::ZERO3, 2, v1::ZERO2, 2},
                                           ModeChange{v1::ZERO2, 2, v1::ZERO3, 3},
                                           ModeChange{v1::ZERO3, 3, v1::ZERO2, 2}),
                         [](const ::testing::TestParamInfo<ModeChange>& info) {
                           return absl::StrCat(
                               v1::Mode_Name(info.param.from_mode), "W", info.param.from, "to",
                               v1::Mode_Name(info.param.to_mode), "W", info.param.to);
                         });

// Issue 38, rows 2 and 6: at the same W a zero3 job's `zeroshard export` (at C and at the end)
// equals the zero2 job's bit for bit, and so does its checkpoint at C: every state of every
// tensor, the layout hash and the optimizer step. A checkpoint does not record the mode that wrote
// it, so with this, a resume across zero2 and zero3 loads exactly what a resume in one mode loads
// (the cells above resume zero3 at another W; AllPairs resumes zero2; ResumeFromTest resumes one
// mode's checkpoint in the other through JobSpec.resume_from). Fails before the fix: mode ZERO3 was
// refused at submission.
class Zero3EqualsZero2Test : public ::testing::TestWithParam<int> {};

TEST_P(Zero3EqualsZero2Test, ExportAndCheckpointAreBitwiseEqual) {
  const int world_size = GetParam();
  absl::StatusOr<const ReferenceRun*> zero2 = ReferenceAt(v1::ZERO2, world_size);
  ASSERT_TRUE(zero2.ok()) << zero2.status();
  absl::StatusOr<const ReferenceRun*> zero3 = ReferenceAt(v1::ZERO3, world_size);
  ASSERT_TRUE(zero3.ok()) << zero3.status();
  EXPECT_TRUE(BitwiseEqual((*zero2)->final_params, (*zero3)->final_params))
      << "max relative difference "
      << MaxRelativeDifference((*zero2)->final_params, (*zero3)->final_params).relative;
  EXPECT_TRUE(BitwiseEqual((*zero2)->params_at_resume_step, (*zero3)->params_at_resume_step));
  const CheckpointContents& expected = (*zero2)->checkpoint_at_resume_step;
  const CheckpointContents& actual = (*zero3)->checkpoint_at_resume_step;
  EXPECT_EQ(actual.layout_hash, expected.layout_hash);
  EXPECT_EQ(actual.optimizer_step, expected.optimizer_step);
  ASSERT_FALSE(expected.states.empty());
  ASSERT_EQ(actual.states.size(), expected.states.size());
  for (const auto& [key, values] : expected.states) {
    const auto found = actual.states.find(key);
    ASSERT_NE(found, actual.states.end()) << key;
    ASSERT_EQ(found->second.size(), values.size()) << key;
    EXPECT_EQ(std::memcmp(found->second.data(), values.data(), values.size() * sizeof(float)), 0)
        << key << " differs";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryWorldSize, Zero3EqualsZero2Test, ::testing::Range(1, kMaxWorkers + 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("W", info.param);
                         });

}  // namespace
}  // namespace zeroshard::testing
