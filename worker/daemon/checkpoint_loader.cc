// Loading the checkpoint a generation resumes from, through the checkpoint root's directory
// descriptors (no link followed), and only the job's own checkpoints unless one is named.
#include "worker/daemon/checkpoint_loader.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zeroshard::worker {
namespace {

// The verdict a rank publishes: empty for usable, else why not.
constexpr char kUsable[] = "ok";

std::string VerdictKey(absl::string_view prefix, int64_t step, int32_t rank) {
  return absl::StrCat(prefix, "checkpoint/", step, "/", rank);
}

// Publishes this rank's verdict under `prefix` and collects the others' refusals ("rank r: why").
absl::StatusOr<std::vector<std::string>> Agree(comm::Store& store, absl::string_view prefix,
                                               int64_t step, int32_t rank, int32_t world_size,
                                               const absl::Status& verdict,
                                               absl::Duration timeout) {
  ZS_RETURN_IF_ERROR(
      store.Set(VerdictKey(prefix, step, rank), verdict.ok() ? kUsable : verdict.ToString()));
  std::vector<std::string> refusals;
  for (int32_t r = 0; r < world_size; ++r) {
    ZS_ASSIGN_OR_RETURN(const std::string theirs, store.Get(VerdictKey(prefix, step, r), timeout));
    if (theirs != kUsable) refusals.push_back(absl::StrCat("rank ", r, ": ", theirs));
  }
  return refusals;
}

// FAILED_PRECONDITION when `header` describes another model, optimizer or parameter dtype.
absl::Status CheckSameModel(const v1::ShardHeader& header, const sharding::ShardPlan& plan,
                            const CheckpointLoadOptions& options, const std::string& where) {
  if (header.tensors_size() != plan.num_tensors()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": tensors: the checkpoint holds ", header.tensors_size(),
        " tensors, the job's model has ", plan.num_tensors(), " (a checkpoint of another model)"));
  }
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    const v1::CheckpointTensor& saved = header.tensors(static_cast<int>(t));
    const sharding::TensorSpec& mine = plan.tensors()[t];
    if (saved.name() != mine.name || !std::equal(saved.shape().begin(), saved.shape().end(),
                                                 mine.shape.begin(), mine.shape.end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": tensors[", t, "]: the checkpoint has \"", saved.name(), "\" [",
          absl::StrJoin(saved.shape(), ", "), "], the job's model \"", mine.name, "\" [",
          absl::StrJoin(mine.shape, ", "), "] (a checkpoint of another model)"));
    }
  }
  if (header.optimizer() != options.optimizer) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": optimizer: the checkpoint holds ", v1::OptimizerKind_Name(header.optimizer()),
        " state, the job uses ", v1::OptimizerKind_Name(options.optimizer)));
  }
  if (header.param_dtype() != options.param_dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": param_dtype: the checkpoint stores ", v1::DType_Name(header.param_dtype()),
        " parameters, the job ", v1::DType_Name(options.param_dtype)));
  }
  return absl::OkStatus();
}

// Reads (and so verifies) every range `engine` will restore. DATA_LOSS for a corrupt file.
absl::Status VerifyRanges(const checkpoint::CheckpointReader& reader,
                          const sharding::ShardPlan& plan, const engine::Engine& engine) {
  std::vector<char> scratch;
  for (const engine::Engine::SavedFragment& range : engine.RestoredRanges()) {
    scratch.resize(range.bytes());
    ZS_RETURN_IF_ERROR(reader.Read(range.state, plan.tensors()[range.tensor].name, range.begin,
                                   range.end, scratch.data(), scratch.size()));
  }
  return absl::OkStatus();
}

// One candidate: this rank's verdict (the files open, hold this model, and every range it needs
// reads back with its checksum), every rank's agreement, and the restore when all can read it.
// False when it was passed over (reported in loaded.passed_over).
absl::StatusOr<bool> TryCheckpoint(absl::StatusOr<checkpoint::CommittedCheckpoint> candidate,
                                   int64_t step, const std::string& directory,
                                   const CheckpointLoadOptions& options,
                                   const sharding::ShardPlan& plan, engine::Engine& engine,
                                   comm::Store& store, LoadedCheckpoint& loaded) {
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
      candidate.ok()
          ? checkpoint::CheckpointReader::Open(*std::move(candidate))
          : absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>>(candidate.status());
  absl::Status verdict = reader.status();
  if (verdict.ok()) {
    ZS_RETURN_IF_ERROR(CheckSameModel((*reader)->header(), plan, options, directory));
    verdict = VerifyRanges(**reader, plan, engine);
  }
  // Every rank's verdict, so that all load the same checkpoint.
  ZS_ASSIGN_OR_RETURN(const std::vector<std::string> refusals,
                      Agree(store, options.store_prefix, step, options.rank, options.world_size,
                            verdict, options.agreement_timeout));
  if (!refusals.empty()) {
    loaded.passed_over.push_back(absl::StrCat("checkpoint at step ", step, " (", directory,
                                              ") unusable: ", absl::StrJoin(refusals, "; ")));
    ZS_LOG(WARNING) << loaded.passed_over.back();
    return false;
  }
  const v1::ShardHeader& header = (*reader)->header();
  engine::Engine::SavedScalars scalars;
  scalars.optimizer_step = header.optimizer_step();
  scalars.loss_scale = header.loss_scale();
  scalars.good_steps = header.loss_scale_good_steps();
  scalars.tensor_steps.assign(header.tensor_steps().begin(), header.tensor_steps().end());
  ZS_RETURN_IF_ERROR(engine.RestoreState(
      scalars, [&](const engine::Engine::SavedFragment& range, absl::Span<char> out) {
        return (*reader)->Read(range.state, plan.tensors()[range.tensor].name, range.begin,
                               range.end, out.data(), out.size());
      }));
  loaded.step = step;
  loaded.directory = directory;
  loaded.manifest = (*reader)->checkpoint().manifest;
  return true;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const CheckpointLoadOptions& options,
                                                const sharding::ShardPlan& plan,
                                                engine::Engine& engine, comm::Store& store) {
  LoadedCheckpoint loaded;
  if (options.named_step_dir != nullptr) {
    // The one checkpoint the trainer opened: every rank considers it, readable here or not.
    const std::string& directory = options.named_step_dir->path();
    absl::StatusOr<checkpoint::Directory> step_dir = options.named_step_dir->Duplicate();
    absl::StatusOr<checkpoint::CommittedCheckpoint> candidate =
        step_dir.ok() ? checkpoint::ReadCommittedCheckpoint(*std::move(step_dir), options.max_step,
                                                            options.job_id)
                      : step_dir.status();
    ZS_ASSIGN_OR_RETURN(const bool restored,
                        TryCheckpoint(std::move(candidate), options.max_step, directory, options,
                                      plan, engine, store, loaded));
    if (restored) return loaded;
    return absl::DataLossError(absl::StrJoin(loaded.passed_over, "; "));
  }
  const std::string job_path = options.job_dir.empty()
                                   ? options.root
                                   : checkpoint::JobCheckpointDir(options.root, options.job_dir);
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root,
                      checkpoint::Directory::OpenRoot(options.root));
  ZS_ASSIGN_OR_RETURN(checkpoint::CheckpointListing listing,
                      checkpoint::ListCheckpoints(root, options.job_dir, options.job_id));
  // Links and other jobs' checkpoints in range: never loaded, reported.
  for (const checkpoint::RefusedStep& refused : listing.refused) {
    if (refused.step > options.max_step || refused.step < options.min_step) continue;
    loaded.passed_over.push_back(absl::StrCat("step ", refused.step, " (", refused.directory,
                                              ") refused: ", refused.reason.message()));
    ZS_LOG(WARNING) << loaded.passed_over.back();
  }
  // Newest first by (generation, step), as the coordinator's latest_checkpoint.
  for (checkpoint::CommittedCheckpoint& candidate : listing.committed) {
    if (candidate.step > options.max_step || candidate.step < options.min_step) continue;
    const int64_t step = candidate.step;
    const std::string directory = candidate.directory;
    ZS_ASSIGN_OR_RETURN(const bool restored, TryCheckpoint(std::move(candidate), step, directory,
                                                           options, plan, engine, store, loaded));
    if (restored) return loaded;
  }
  return absl::DataLossError(absl::StrCat(
      "no usable checkpoint at or before step ", options.max_step,
      options.min_step > 0 ? absl::StrCat(" (and at or after step ", options.min_step, ")") : "",
      " in ", job_path,
      loaded.passed_over.empty() ? " (none committed)"
                                 : absl::StrCat(": ", absl::StrJoin(loaded.passed_over, "; "))));
}

absl::StatusOr<NamedCheckpoint> LocateNamedCheckpoint(absl::string_view checkpoint_root,
                                                      absl::string_view manifest_path,
                                                      UniqueFd passed_step_dir) {
  const std::filesystem::path manifest(std::string{manifest_path});
  const std::filesystem::path step_dir = manifest.parent_path();
  const std::optional<int64_t> step = checkpoint::ParseStepDirName(step_dir.filename().string());
  // A passed directory may have any name (a step directory copied elsewhere under a name of the
  // user's): its manifest says the step. A path walked from the root must be a step directory.
  if (!manifest.is_absolute() || manifest.filename() != checkpoint::kManifestFileName ||
      (!step.has_value() && !passed_step_dir.valid())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest: \"", manifest_path, "\" is not the absolute path of a checkpoint's ",
        checkpoint::kManifestFileName,
        manifest.is_absolute() && manifest.filename() == checkpoint::kManifestFileName
            ? " in a step-<12-digit step> directory (the name is needed only when the trainer "
              "passes no descriptor of the directory)"
            : ""));
  }
  NamedCheckpoint named;
  if (passed_step_dir.valid()) {
    ZS_ASSIGN_OR_RETURN(checkpoint::Directory opened,
                        checkpoint::Directory::FromPassedDescriptor(
                            passed_step_dir.Release(), step_dir.lexically_normal().string()));
    if (step.has_value()) {
      named.step = *step;
    } else {
      absl::StatusOr<v1::CheckpointManifest> read = checkpoint::ReadManifest(opened);
      if (!read.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest: \"", manifest_path, "\": ", read.status().message()));
      }
      named.step = read->step();
    }
    named.step_dir = std::make_shared<const checkpoint::Directory>(std::move(opened));
    return named;
  }
  named.step = *step;
  const std::filesystem::path job_dir = step_dir.parent_path().lexically_normal();
  if (!checkpoint_root.empty()) {
    std::error_code error;
    const std::filesystem::path root =
        std::filesystem::absolute(std::string{checkpoint_root}, error).lexically_normal();
    const std::filesystem::path relative = job_dir.lexically_relative(root);
    const std::string under = relative.generic_string();
    if (!error && !relative.empty() && under != ".." && under.rfind("../", 0) != 0) {
      named.root = std::string{checkpoint_root};
      named.job_dir = under == "." ? "" : under;
      return named;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "manifest: \"", manifest_path, "\" is outside the worker's checkpoint root",
      checkpoint_root.empty() ? "" : absl::StrCat(" ", checkpoint_root),
      ": a checkpoint elsewhere must come as the descriptor of its step directory, opened by the "
      "trainer and passed with load_state (zeroshard.torch does; the worker opens no path outside "
      "its root on a trainer's word)"));
}

absl::Status LoadFullState(const FullStateLoadOptions& options, checkpoint::File file,
                           const sharding::ShardPlan& plan, engine::Engine& engine,
                           comm::Store& store) {
  const std::vector<engine::Engine::SavedFragment> ranges = engine.RestoredRanges();
  absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsReader>> reader =
      checkpoint::SafetensorsReader::Open(std::move(file));
  absl::Status verdict = reader.status();
  // Each range's tensor, checked before any rank changes its engine.
  std::vector<const checkpoint::TensorInfo*> sources;
  for (const engine::Engine::SavedFragment& range : ranges) {
    if (!verdict.ok()) break;
    const sharding::TensorSpec& tensor = plan.tensors()[range.tensor];
    const std::string name = absl::StrCat(range.state, "/", tensor.name);
    const checkpoint::TensorInfo* info = (*reader)->Find(name);
    if (info == nullptr) {
      verdict = absl::FailedPreconditionError(absl::StrCat(options.path, ": no tensor ", name));
    } else if (info->dtype != checkpoint::SafetensorsDType::kF32 ||
               range.dtype != numerics::DType::kFloat32) {
      verdict = absl::FailedPreconditionError(
          absl::StrCat(options.path, ": ", name, " is not F32 (attached jobs are fp32)"));
    } else if (static_cast<int64_t>(info->num_bytes()) != tensor.num_elements * 4) {
      verdict = absl::FailedPreconditionError(
          absl::StrCat(options.path, ": ", name, " holds ", info->num_bytes() / 4,
                       " elements, the tensor ", tensor.num_elements));
    }
    sources.push_back(info);
  }
  ZS_ASSIGN_OR_RETURN(const std::vector<std::string> refusals,
                      Agree(store, options.store_prefix, options.optimizer_step, options.rank,
                            options.world_size, verdict, options.agreement_timeout));
  if (!refusals.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("full state file refused: ", absl::StrJoin(refusals, "; ")));
  }
  engine::Engine::SavedScalars scalars = engine.scalars();
  scalars.optimizer_step = options.optimizer_step;
  scalars.tensor_steps = options.tensor_steps;
  // RestoreState reads the ranges in RestoredRanges() order: the same as `sources`.
  size_t next = 0;
  return engine.RestoreState(
      scalars, [&](const engine::Engine::SavedFragment& range, absl::Span<char> out) {
        if (next >= sources.size()) {
          return absl::InternalError("RestoreState read more ranges than RestoredRanges lists");
        }
        const checkpoint::TensorInfo& source = *sources[next++];
        return (*reader)->ReadTensorBytes(source, static_cast<uint64_t>(range.begin) * 4,
                                          out.data(), out.size());
      });
}

}  // namespace zeroshard::worker
