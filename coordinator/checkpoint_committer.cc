// The coordinator's side of a checkpoint: path checks, the manifest, its write, pruning,
// rewinds, and finding committed checkpoints to export or verify.
#include "coordinator/checkpoint_committer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"

namespace zeroshard::coordinator {

using ::google::protobuf::util::TimeUtil;

namespace {

// The CheckpointRecord a job keeps of a committed checkpoint in its directory `policy_dir`.
v1::CheckpointRecord RecordOfCommitted(const checkpoint::CommittedCheckpoint& committed,
                                       const std::string& policy_dir) {
  v1::CheckpointRecord record;
  record.set_step(committed.step);
  record.set_generation(committed.generation());
  record.set_world_size(committed.manifest.world_size());
  record.set_manifest_path(absl::StrCat(policy_dir, "/", checkpoint::StepDirName(committed.step),
                                        "/", checkpoint::kManifestFileName));
  *record.mutable_commit_time() = committed.manifest.commit_time();
  return record;
}

// Whether `manifest` is the checkpoint a rewind's state was loaded from.
bool IsLoadedCheckpoint(const v1::CheckpointManifest& manifest,
                        const v1::RewindJobRequest& request) {
  if (!request.has_loaded_checkpoint()) return false;
  const v1::CheckpointRecord& loaded = request.loaded_checkpoint();
  return manifest.job_id() == request.loaded_job_id() && manifest.step() == loaded.step() &&
         manifest.generation() == loaded.generation() &&
         manifest.commit_time().seconds() == loaded.commit_time().seconds() &&
         manifest.commit_time().nanos() == loaded.commit_time().nanos();
}

}  // namespace

CheckpointCommitter::CheckpointCommitter(std::string root,
                                         std::shared_ptr<checkpoint::StorageHooks> storage_hooks)
    : root_(std::move(root)), storage_hooks_(std::move(storage_hooks)) {}

absl::StatusOr<checkpoint::Directory> CheckpointCommitter::OpenRoot() const {
  // From the trusted root, no link followed below it (checkpoint/directory.h).
  return checkpoint::Directory::OpenRoot(root_, storage_hooks_);
}

absl::Status CheckpointCommitter::CheckRankFile(const v1::CommitCheckpointRequest& request,
                                                const std::string& policy_dir,
                                                int32_t world_size) const {
  if (root_.empty()) {
    return absl::FailedPreconditionError(
        "checkpoint_root: the coordinator was started without --checkpoint_root, so it cannot "
        "commit checkpoints");
  }
  const std::string expected_path =
      absl::StrCat(policy_dir, "/", checkpoint::StepDirName(request.step()), "/",
                   checkpoint::ShardFileName(request.rank(), world_size));
  if (request.path() != expected_path) {
    return absl::InvalidArgumentError(absl::StrCat("path: rank ", request.rank(), " of step ",
                                                   request.step(), " must commit \"", expected_path,
                                                   "\", got \"", request.path(), "\""));
  }
  return absl::OkStatus();
}

ManifestToWrite CheckpointCommitter::BuildManifest(
    const v1::Job& job, int64_t generation, int64_t step, std::optional<uint64_t> layout_hash,
    std::vector<v1::CommitCheckpointRequest> commits, absl::Time now,
    std::shared_ptr<absl::Mutex> job_volume_mu) const {
  const int32_t world_size = job.worker_ids_size();
  ManifestToWrite todo;
  todo.job_id = job.id();
  todo.generation = generation;
  todo.step = step;
  todo.keep = job.spec().checkpoint().keep();
  todo.policy_dir = job.spec().checkpoint().dir();
  todo.job_dir = checkpoint::JobCheckpointDir(root_, todo.policy_dir);
  todo.step_dir = checkpoint::StepDir(todo.job_dir, step);
  todo.job_volume_mu = std::move(job_volume_mu);
  v1::CheckpointManifest& manifest = todo.manifest;
  manifest.set_job_id(job.id());
  manifest.set_step(step);
  manifest.set_generation(generation);
  manifest.set_world_size(world_size);
  if (layout_hash.has_value()) manifest.set_layout_hash(*layout_hash);
  std::sort(commits.begin(), commits.end(),
            [](const v1::CommitCheckpointRequest& a, const v1::CommitCheckpointRequest& b) {
              return a.rank() < b.rank();
            });
  for (const v1::CommitCheckpointRequest& commit : commits) {
    v1::CheckpointFile& file = *manifest.add_files();
    file.set_rank(commit.rank());
    file.set_path(checkpoint::ShardFileName(commit.rank(), world_size));
    file.set_bytes(commit.bytes());
    file.set_crc32c(commit.crc32c());
  }
  *manifest.mutable_commit_time() = TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(now));
  return todo;
}

absl::StatusOr<checkpoint::Directory> CheckpointCommitter::WriteManifest(
    const ManifestToWrite& todo) const {
  ZS_ASSIGN_OR_RETURN(checkpoint::Directory root, OpenRoot());
  ZS_RETURN_IF_ERROR(checkpoint::WriteManifest(root, todo.policy_dir, todo.manifest));
  return root;
}

std::optional<std::string> CheckpointCommitter::Prune(const checkpoint::Directory& root,
                                                      const ManifestToWrite& todo) const {
  // Only committed checkpoints count towards `keep`; older uncommitted step directories go too.
  // Links and other jobs' checkpoints are left, reported.
  absl::StatusOr<checkpoint::PruneResult> pruned =
      checkpoint::PruneCheckpoints(root, todo.policy_dir, todo.job_id, todo.keep);
  if (pruned.ok() && pruned->refused.empty()) return std::nullopt;
  return pruned.ok() ? absl::StrCat("pruning old checkpoints: ",
                                    checkpoint::SummarizeRefused(pruned->refused))
                     : absl::StrCat("pruning old checkpoints failed: ", pruned.status().message());
}

v1::CheckpointRecord CheckpointCommitter::RecordOf(const ManifestToWrite& todo) {
  v1::CheckpointRecord checkpoint;
  checkpoint.set_step(todo.step);
  checkpoint.set_generation(todo.generation);
  checkpoint.set_world_size(todo.manifest.world_size());
  checkpoint.set_manifest_path(absl::StrCat(todo.policy_dir, "/",
                                            checkpoint::StepDirName(todo.step), "/",
                                            checkpoint::kManifestFileName));
  *checkpoint.mutable_commit_time() = todo.manifest.commit_time();
  return checkpoint;
}

absl::StatusOr<RewoundCheckpoints> CheckpointCommitter::SupersedeAfter(
    const std::string& policy_dir, const v1::RewindJobRequest& request, absl::Time now) const {
  const int64_t step = request.step();
  RewoundCheckpoints rewound;
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root, OpenRoot());
  ZS_ASSIGN_OR_RETURN(checkpoint::CheckpointListing listing,
                      checkpoint::ListCheckpoints(root, policy_dir, request.job_id()));
  v1::CheckpointSupersession why;
  why.set_loaded_step(step);
  why.set_generation(request.generation());
  *why.mutable_time() = TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(now));
  why.set_reason(request.reason());
  // Newest first (CheckpointOrder): a failure part-way leaves the older ones committed.
  for (const checkpoint::CommittedCheckpoint& committed : listing.committed) {
    const bool retire = committed.step > step || (committed.step == step &&
                                                  !IsLoadedCheckpoint(committed.manifest, request));
    if (!retire) {
      if (!rewound.latest.has_value()) rewound.latest = RecordOfCommitted(committed, policy_dir);
      continue;
    }
    absl::StatusOr<std::string> moved =
        checkpoint::SupersedeCheckpoint(root, policy_dir, committed, why);
    if (!moved.ok()) {
      return absl::Status(
          moved.status().code(),
          absl::StrCat("retiring the checkpoint of step ", committed.step,
                       " (the job went back to step ", step, "): ", moved.status().message()));
    }
    ZS_LOG(INFO) << request.job_id() << ": the checkpoint of step " << committed.step
                 << " is superseded (the job went back to step " << step << "), moved to "
                 << *moved;
    rewound.superseded_steps.push_back(committed.step);
  }
  std::reverse(rewound.superseded_steps.begin(), rewound.superseded_steps.end());
  return rewound;
}

absl::StatusOr<ExportSource> CheckpointCommitter::FindExport(const v1::Job& job,
                                                             std::optional<int64_t> step) const {
  const std::string& job_id = job.id();
  if (root_.empty()) {
    return absl::FailedPreconditionError(
        "checkpoint_root: the coordinator was started without --checkpoint_root, so it has no "
        "checkpoints to export");
  }
  const std::string job_dir = checkpoint::JobCheckpointDir(root_, job.spec().checkpoint().dir());
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root, OpenRoot());
  ZS_ASSIGN_OR_RETURN(checkpoint::CheckpointListing listing,
                      checkpoint::ListCheckpoints(root, job.spec().checkpoint().dir(), job.id()));
  // Oldest first, for people.
  std::vector<int64_t> steps;
  for (const checkpoint::CommittedCheckpoint& committed : listing.committed) {
    steps.push_back(committed.step);
  }
  std::reverse(steps.begin(), steps.end());
  const std::string committed_steps =
      steps.empty() ? "no checkpoint is committed"
                    : absl::StrCat("committed steps: ", absl::StrJoin(steps, ", "),
                                   " (pass one as step to export it)");
  ExportSource source;
  for (const v1::AttachedTensor& tensor : job.spec().workload().attached().tensors()) {
    if (tensor.aliases_size() == 0) continue;
    source.aliases[tensor.name()].assign(tensor.aliases().begin(), tensor.aliases().end());
  }
  // An attached job (steps 0) has no fixed last step: without `step` it exports its latest
  // committed checkpoint, which is its final state once it SUCCEEDED (its trainers finished and
  // their workers wrote it).
  if (job.spec().steps() == 0) {
    if (!step.has_value()) {
      if (listing.committed.empty()) {
        return absl::NotFoundError(
            absl::StrCat("job_id: ", job_id, " has no committed checkpoint yet (it is ",
                         v1::JobState_Name(job.state()), "); ", committed_steps));
      }
      source.checkpoint = std::move(listing.committed.front());
      source.is_final = job.state() == v1::SUCCEEDED;
      return source;
    }
    const int64_t newest = listing.committed.empty() ? -1 : listing.committed.front().step;
    for (checkpoint::CommittedCheckpoint& committed : listing.committed) {
      if (committed.step != *step) continue;
      source.is_final = job.state() == v1::SUCCEEDED && *step == newest;
      source.checkpoint = std::move(committed);
      return source;
    }
    return absl::NotFoundError(absl::StrCat("step: ", job_id,
                                            " has no committed checkpoint at step ", *step, " in ",
                                            job_dir, "; ", committed_steps));
  }
  const bool has_final = job.state() == v1::SUCCEEDED && job.has_latest_checkpoint() &&
                         job.latest_checkpoint().step() == job.spec().steps();
  if (!step.has_value() && !has_final) {
    std::string state = absl::StrCat("it is ", v1::JobState_Name(job.state()));
    if (job.has_latest_checkpoint()) {
      absl::StrAppend(&state, " with its latest checkpoint at step ",
                      job.latest_checkpoint().step());
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "job_id: ", job_id, " has no final checkpoint (one at its last step, ", job.spec().steps(),
        ", of a job that SUCCEEDED): ", state, "; ", committed_steps));
  }
  const int64_t wanted = step.value_or(job.latest_checkpoint().step());
  for (checkpoint::CommittedCheckpoint& committed : listing.committed) {
    if (committed.step != wanted) continue;
    source.is_final = has_final && wanted == job.latest_checkpoint().step();
    source.checkpoint = std::move(committed);
    return source;
  }
  return absl::NotFoundError(absl::StrCat(step.has_value() ? "step: " : "job_id: ", job_id,
                                          " has no committed checkpoint at step ", wanted, " in ",
                                          job_dir, "; ", committed_steps));
}

absl::StatusOr<CommittedCheckpointSource> CheckpointCommitter::FindCommitted(
    const v1::Job& job, std::optional<int64_t> step) const {
  const std::string& job_id = job.id();
  if (root_.empty()) {
    return absl::FailedPreconditionError(
        "checkpoint_root: the coordinator was started without --checkpoint_root, so it has no "
        "checkpoints to verify");
  }
  const std::string& policy_dir = job.spec().checkpoint().dir();
  const std::string job_dir = checkpoint::JobCheckpointDir(root_, policy_dir);
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root, OpenRoot());
  // For an error only: the listing reads every manifest of the job.
  auto committed_steps = [&]() -> std::string {
    absl::StatusOr<checkpoint::CheckpointListing> listing =
        checkpoint::ListCheckpoints(root, policy_dir, job_id);
    if (!listing.ok()) {
      return absl::StrCat("its checkpoints could not be listed: ", listing.status().message());
    }
    // Oldest first, in the listing's order (checkpoint::CheckpointOrder), as exports list them.
    std::vector<int64_t> steps;
    for (const checkpoint::CommittedCheckpoint& committed : listing->committed) {
      steps.push_back(committed.step);
    }
    std::reverse(steps.begin(), steps.end());
    return steps.empty() ? "no checkpoint is committed"
                         : absl::StrCat("committed steps: ", absl::StrJoin(steps, ", "),
                                        " (pass one as step to verify it)");
  };
  if (!step.has_value() && !job.has_latest_checkpoint()) {
    return absl::NotFoundError(
        absl::StrCat("job_id: ", job_id, " has no committed checkpoint (it is ",
                     v1::JobState_Name(job.state()), "); ", committed_steps()));
  }
  const int64_t wanted = step.value_or(job.latest_checkpoint().step());
  absl::StatusOr<checkpoint::CommittedCheckpoint> opened =
      checkpoint::OpenCommittedCheckpoint(root, policy_dir, wanted, job_id);
  if (absl::IsNotFound(opened.status())) {
    return absl::NotFoundError(absl::StrCat(
        step.has_value() ? "step: " : "job_id: ", job_id, " has no committed checkpoint at step ",
        wanted, " in ", job_dir, " (", opened.status().message(), "); ", committed_steps()));
  }
  if (!opened.ok()) return opened.status();
  CommittedCheckpointSource source;
  source.relative_directory = absl::StrCat(policy_dir, "/", checkpoint::StepDirName(wanted));
  source.record.set_step(wanted);
  source.record.set_generation(opened->manifest.generation());
  source.record.set_world_size(opened->manifest.world_size());
  source.record.set_manifest_path(
      absl::StrCat(source.relative_directory, "/", checkpoint::kManifestFileName));
  *source.record.mutable_commit_time() = opened->manifest.commit_time();
  source.checkpoint = *std::move(opened);
  return source;
}

}  // namespace zeroshard::coordinator
