// A checkpoint's commit on the coordinator's side, and every read of the checkpoint root the
// job manager makes: the rank files' path checks, the manifest built from the ranks' commits, its
// write (the commit) and the pruning after it, the retiring of checkpoints a rewind supersedes,
// and finding the committed checkpoint an export or a verification reads.
#ifndef ZEROSHARD_COORDINATOR_CHECKPOINT_COMMITTER_H_
#define ZEROSHARD_COORDINATOR_CHECKPOINT_COMMITTER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/directory.h"
#include "checkpoint/export.h"
#include "checkpoint/manifest.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// The committed checkpoint an export reads (JobManager::FindExportCheckpoint).
struct ExportSource {
  checkpoint::CommittedCheckpoint checkpoint;
  // It is the job's final state: the job SUCCEEDED and this is its checkpoint at spec.steps (an
  // attached job's: its latest, written when its trainers finished).
  bool is_final = false;
  // An attached model's tied weights: each tensor's other names in the trainer's state_dict()
  // (AttachedTensor.aliases), which the export writes too.
  checkpoint::CheckpointExport::Aliases aliases;
};

// A committed checkpoint of a job, opened for a full read (JobManager::FindCommittedCheckpoint).
struct CommittedCheckpointSource {
  // Reached from the checkpoint root without following links; its manifest is valid and names
  // the job.
  checkpoint::CommittedCheckpoint checkpoint;
  // The checkpoint as a job's record names one, from its manifest: step, generation, world
  // size, the manifest's path relative to the checkpoint root, commit time.
  v1::CheckpointRecord record;
  // The step directory relative to the checkpoint root ("job-000001/step-000000000004").
  std::string relative_directory;
};

// A checkpoint whose every rank committed, to be made to exist by its manifest (written outside
// the manager's lock, under the job's volume mutex).
struct ManifestToWrite {
  std::string job_id;
  int64_t generation = 0;
  int64_t step = 0;
  int keep = 1;
  std::string policy_dir;  // spec.checkpoint.dir
  std::string job_dir;     // under the checkpoint root
  std::string step_dir;
  v1::CheckpointManifest manifest;
  std::shared_ptr<absl::Mutex> job_volume_mu;
};

// What a rewind did to the job's committed checkpoints (CheckpointCommitter::SupersedeAfter).
struct RewoundCheckpoints {
  // The steps whose checkpoints were superseded (moved aside, marked so), oldest first.
  std::vector<int64_t> superseded_steps;
  // The newest checkpoint left committed, as the job's record names one; unset when none is.
  std::optional<v1::CheckpointRecord> latest;
};

// Thread contract: thread-safe; it holds only its configuration. It takes no lock of its own:
// calls that touch one job's directories (WriteManifest, Prune, SupersedeAfter) run under that
// job's volume mutex, which the caller (JobManager) holds, and never under the manager's lock,
// so heartbeats do not wait behind a slow shared volume. Every file-system call works from the
// trusted root without following links (checkpoint/directory.h).
class CheckpointCommitter {
 public:
  // `root` empty: checkpoints cannot be committed, exported or verified (enabled() is false).
  CheckpointCommitter(std::string root, std::shared_ptr<checkpoint::StorageHooks> storage_hooks);

  bool enabled() const { return !root_.empty(); }
  const std::string& root() const { return root_; }

  // A WRITTEN commit's checks: FAILED_PRECONDITION without a root; INVALID_ARGUMENT when the
  // rank's file is not where its job's checkpoint directory `policy_dir` puts it at W =
  // `world_size`.
  absl::Status CheckRankFile(const v1::CommitCheckpointRequest& request,
                             const std::string& policy_dir, int32_t world_size) const;
  // The manifest of a step every rank of `job` committed (`commits`, in any order), committed at
  // `now`, with the plan's `layout_hash` when there is one.
  ManifestToWrite BuildManifest(const v1::Job& job, int64_t generation, int64_t step,
                                std::optional<uint64_t> layout_hash,
                                std::vector<v1::CommitCheckpointRequest> commits, absl::Time now,
                                std::shared_ptr<absl::Mutex> job_volume_mu) const;
  // Writes the manifest (tmp, fsync, rename, fsync dir): the commit. Returns the opened root, for
  // Prune once the manager recorded the checkpoint.
  absl::StatusOr<checkpoint::Directory> WriteManifest(const ManifestToWrite& todo) const;
  // Prunes the job's older checkpoints past its `keep` (only committed ones count; older
  // uncommitted step directories go too). Returns what went wrong, for a NOTICE: links and other
  // jobs' checkpoints left in place, or the failure; nullopt when all went well.
  std::optional<std::string> Prune(const checkpoint::Directory& root,
                                   const ManifestToWrite& todo) const;
  // The record of a written manifest, as the job keeps its latest checkpoint.
  static v1::CheckpointRecord RecordOf(const ManifestToWrite& todo);

  // RewindJob: supersedes the job's committed checkpoints after the step the rank went back to,
  // and the one at that step unless it is the one the rank loaded. Newest first, so a failure
  // part-way leaves the older ones committed.
  absl::StatusOr<RewoundCheckpoints> SupersedeAfter(const std::string& policy_dir,
                                                    const v1::RewindJobRequest& request,
                                                    absl::Time now) const;

  // The committed checkpoint of `job` (a snapshot of it) that ExportCheckpoint reads; see
  // JobManager::FindExportCheckpoint.
  absl::StatusOr<ExportSource> FindExport(const v1::Job& job, std::optional<int64_t> step) const;
  // The committed checkpoint of `job` that VerifyCheckpoint reads; see
  // JobManager::FindCommittedCheckpoint.
  absl::StatusOr<CommittedCheckpointSource> FindCommitted(const v1::Job& job,
                                                          std::optional<int64_t> step) const;

 private:
  absl::StatusOr<checkpoint::Directory> OpenRoot() const;

  const std::string root_;
  const std::shared_ptr<checkpoint::StorageHooks> storage_hooks_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_CHECKPOINT_COMMITTER_H_
