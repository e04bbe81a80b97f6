// The commit record of a checkpoint and the directory layout around it: manifest.json, which the
// coordinator writes last, and the functions that name, list and prune step directories.
//
// Layout: <checkpoint root>/<policy dir>/step-<12-digit step>/ holds one
// rank-<5-digit rank>-of-<5-digit world size>.safetensors per rank (shard_file.h) and then
// manifest.json. A step directory without a valid manifest is not a checkpoint: readers skip
// it, and pruning deletes it once a newer checkpoint is committed. A checkpoint retired because
// the job went back to an earlier step is renamed to superseded-step-<12-digit step>-<n>/ and its
// manifest marked so (SupersedeCheckpoint): a committed manifest is never overwritten.
//
// The volume is shared with every worker, so it is hostile ground: everything below the trusted
// root is reached through directory descriptors without following links (directory.h), a link
// or an entry of the wrong type is refused (FAILED_PRECONDITION naming it), and readers only
// accept manifests of their own job.
#ifndef ZEROSHARD_CHECKPOINT_MANIFEST_H_
#define ZEROSHARD_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/directory.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {

inline constexpr int32_t kManifestFormatVersion = 1;
inline constexpr char kManifestFileName[] = "manifest.json";
// The largest world size the file names hold (5 digits).
inline constexpr int32_t kMaxNamedWorldSize = 99999;

// ---- Names: the only place that spells them. ----

// "<root>/<policy_dir>": one job's checkpoints (policy_dir is CheckpointPolicy.dir, already
// validated as relative without ".."). A path for messages: files are reached through
// Directory, never through this path.
std::string JobCheckpointDir(absl::string_view root, absl::string_view policy_dir);
// "step-000000001200". REQUIRES: step >= 0 (steps of 10^12 and more get more digits).
std::string StepDirName(int64_t step);
// The step a directory name stands for; nullopt for any other name.
std::optional<int64_t> ParseStepDirName(absl::string_view name);
// "<job_dir>/step-000000001200".
std::string StepDir(absl::string_view job_dir, int64_t step);
// "rank-00001-of-00004.safetensors". REQUIRES: 0 <= rank < world_size <= kMaxNamedWorldSize.
std::string ShardFileName(int32_t rank, int32_t world_size);
// "<step_dir>/manifest.json".
std::string ManifestPath(absl::string_view step_dir);
// "superseded-step-000000001200-<copy>": where SupersedeCheckpoint moves a retired checkpoint of
// `step` (`copy` >= 1 tells apart the checkpoints of one step retired one after another). Listings
// do not take it for a step directory. REQUIRES: step >= 0, copy >= 1.
std::string SupersededDirName(int64_t step, int copy);
// The step a superseded checkpoint's directory name stands for; nullopt for any other name.
std::optional<int64_t> ParseSupersededDirName(absl::string_view name);

// The job directory <root>/<job_dir> (job_dir relative: CheckpointPolicy.dir) walked from the
// trusted root without following links (Directory::OpenPath), then its step directory.
absl::StatusOr<Directory> OpenStepDirectory(const Directory& root, absl::string_view job_dir,
                                            int64_t step);

// ---- The manifest. ----

// The most ReadManifest reads. The largest manifest there can be (99999 ranks, the largest
// values) is 12.3 MiB.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;

// INVALID_ARGUMENT naming the field: format_version other than kManifestFormatVersion; empty
// job_id; step or generation < 0; world_size outside [1, kMaxNamedWorldSize]; files not one per
// rank of [0, world_size); a path that is not a plain file name (empty, ".", "..", or with a
// '/'); bytes < 8 (no safetensors file is smaller); no commit_time.
absl::Status ValidateManifest(const v1::CheckpointManifest& manifest);

// Commits the checkpoint of manifest.step() in <root>/<job_dir>: sets format_version, validates
// (ValidateManifest), checks that every listed file is a regular file in the step directory with
// the listed size (FAILED_PRECONDITION naming it otherwise: a shard the coordinator cannot see,
// or a link, which is refused), refuses (FAILED_PRECONDITION naming it, nothing written) a
// manifest.json already there that is not the job's own for this step (job and step; one
// larger than kMaxManifestBytes is refused from its size, unread), then writes manifest.json
// durably: temporary file, fsync,
// rename, fsync of the directory (WriteFileDurably). The job and step directories are reached
// from `root` without following links: a link on the way is refused (FAILED_PRECONDITION
// naming it) and nothing is written. Until the rename completes readers see no checkpoint;
// after it returns OK the commit survives a crash. `before_rename_for_testing` lets tests crash
// between the fsync and the rename; root's StorageHooks see every operation.
// Thread contract: one writer per step directory (the coordinator).
absl::Status WriteManifest(const Directory& root, absl::string_view job_dir,
                           v1::CheckpointManifest manifest,
                           std::function<void()> before_rename_for_testing = nullptr);

// The manifest of `step_dir`. NOT_FOUND when it has none; DATA_LOSS naming the path when it is
// not a valid manifest (ValidateManifest), its step is not the directory's, or it holds more
// than kMaxManifestBytes (naming its size and the cap, found before anything is read);
// FAILED_PRECONDITION for a format_version this reader does not know, and for a manifest.json
// that is a link or not a regular file (refused, never followed); an errno status for I/O errors.
// It does not check the job id: ListCheckpoints and OpenCommittedCheckpoint do.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const Directory& step_dir);

// Reads `file` of `step_dir` whole and checks its size and CRC32C against the manifest entry:
// DATA_LOSS naming the file and both values on a mismatch (a size mismatch is found without
// reading). FAILED_PRECONDITION when the file is a link or not a regular file (refused); NOT_FOUND
// when it is missing. Costs a full read (export and fsck use it; loads rely on the per-fragment
// checksums instead).
absl::Status VerifyCheckpointFile(const Directory& step_dir, const v1::CheckpointFile& file);

// ---- Listing and pruning. ----

// The order of a job's checkpoints, the one key every reader and the coordinator use (listings,
// loads, the latest checkpoint, exports, pruning, the Python reader): (generation, step). A
// generation that resumed from an older step is newer than every checkpoint of the generations
// before it, whatever their steps; within a generation steps only grow, because a job that goes
// back to an earlier step first retires every checkpoint after it (SupersedeCheckpoint).
inline std::pair<int64_t, int64_t> CheckpointOrder(int64_t generation, int64_t step) {
  return {generation, step};
}

// A committed checkpoint of the job, ordered by CheckpointOrder.
struct CommittedCheckpoint {
  int64_t step = 0;
  std::string directory;  // the step directory's path, for messages
  v1::CheckpointManifest manifest;
  // The step directory, held open: readers open its files relative to it (CheckpointReader).
  // Shared so that listings stay copyable; never null in what this library returns.
  std::shared_ptr<const Directory> step_dir;

  int64_t generation() const { return manifest.generation(); }
};

// True when `a` is newer than `b` by CheckpointOrder.
bool IsNewerCheckpoint(const CommittedCheckpoint& a, const CommittedCheckpoint& b);

// A step directory that is not a checkpoint yet, and why (NOT_FOUND: no manifest yet, or the
// checkpoint was abandoned; DATA_LOSS: ReadManifest found no valid manifest).
struct UncommittedStep {
  int64_t step = 0;
  std::string directory;
  absl::Status reason;
  std::shared_ptr<const Directory> step_dir;  // held open, for pruning
};

// An entry named like a step directory that is not this job's to read or delete, and why
// (FAILED_PRECONDITION naming the path): a link or anything but a directory; a directory whose
// manifest.json is a link or not a regular file; a manifest of another job; a manifest of a
// newer format_version. Readers and pruning never touch it; callers report it.
struct RefusedStep {
  int64_t step = 0;
  std::string directory;
  absl::Status reason;
};

// A checkpoint retired by SupersedeCheckpoint: its directory renamed aside, its manifest marked
// (manifest.superseded; unmarked when a crash came between the rename and the mark). Never
// loaded, exported or resumed from; pruning removes it once it is older than every kept
// committed checkpoint.
struct SupersededCheckpoint {
  int64_t step = 0;
  std::string name;       // its directory's name in the job directory
  std::string directory;  // its path, for messages
  v1::CheckpointManifest manifest;
  std::shared_ptr<const Directory> step_dir;  // held open, for pruning
};

struct CheckpointListing {
  std::vector<CommittedCheckpoint> committed;    // newest first: CheckpointOrder
  std::vector<UncommittedStep> uncommitted;      // highest step first
  std::vector<RefusedStep> refused;              // highest step first
  std::vector<SupersededCheckpoint> superseded;  // highest step first, then latest retired
};

// The step directories of <root>/<job_dir> (entries not named like one, or like a superseded
// checkpoint's, are ignored), the job directory reached from `root` without following links (a
// link or file on the way: the FAILED_PRECONDITION refusal naming it). A missing job directory
// lists nothing. A manifest whose job_id is not `job_id` is refused (RefusedStep), never listed
// as committed; std::nullopt accepts any job's (an attached trainer's load of a checkpoint it
// names explicitly). A manifest marked superseded is listed as such wherever it is. Superseded
// checkpoints' directories that are not this job's (a link, another job's manifest) or hold no
// readable manifest are left out. An I/O error reading a directory or a manifest (other than a
// missing manifest) fails the listing rather than passing a checkpoint off as uncommitted.
// Root's StorageHooks see every operation.
// Thread contract: safe to call concurrently with writers and other readers.
absl::StatusOr<CheckpointListing> ListCheckpoints(const Directory& root, absl::string_view job_dir,
                                                  std::optional<absl::string_view> job_id);

// The committed checkpoint of `step` in <root>/<job_dir>, of job `job_id` (std::nullopt: any
// job's). OpenStepDirectory's and ReadManifest's errors; FAILED_PRECONDITION naming the manifest
// when it belongs to another job.
absl::StatusOr<CommittedCheckpoint> OpenCommittedCheckpoint(
    const Directory& root, absl::string_view job_dir, int64_t step,
    std::optional<absl::string_view> job_id);

// The committed checkpoint in `step_dir` (a directory a trainer opened and passed: a copy
// anywhere, FromPassedDescriptor), which must hold the checkpoint of `step`. ReadManifest's
// errors (DATA_LOSS when its step is another), and FAILED_PRECONDITION naming the manifest when
// it belongs to another job than `job_id` (std::nullopt: any job's) or was superseded.
absl::StatusOr<CommittedCheckpoint> ReadCommittedCheckpoint(
    Directory step_dir, int64_t step, std::optional<absl::string_view> job_id);

// Retires the committed checkpoint `checkpoint` (listed or opened from <root>/<job_dir>, the
// job's own): renames its step directory to SupersededDirName(step, n), n the first free copy
// number, so that the step can be checkpointed again without touching it, then writes its
// manifest again, marked `why` (CheckpointManifest.superseded), durably (WriteFileDurably; the
// job directory is synced after the rename). From the rename on, no listing takes it for
// committed. Returns the new directory's path. FAILED_PRECONDITION naming it when the entry
// renamed is not the checkpoint's directory (it changed since it was listed: the mark is not
// written), or when every copy number up to 99999 is taken; errno statuses otherwise.
// Thread contract: one writer per job directory (the coordinator, under the job's volume lock).
absl::StatusOr<std::string> SupersedeCheckpoint(const Directory& root, absl::string_view job_dir,
                                                const CommittedCheckpoint& checkpoint,
                                                const v1::CheckpointSupersession& why);

struct PruneResult {
  std::vector<int64_t> deleted_committed;    // oldest first
  std::vector<int64_t> deleted_uncommitted;  // oldest first
  std::vector<int64_t> deleted_superseded;   // oldest first
  // The listing's refusals, and step directories pruning would have removed but left because
  // they hold something other than regular files (a link, which is never followed): each
  // FAILED_PRECONDITION naming the path. Left in place, for the caller to report.
  std::vector<RefusedStep> refused;
};

// Keeps the `keep` newest committed checkpoints of `job_id` in CheckpointOrder: deletes the
// older committed ones (manifest first, so each stops being a checkpoint before its files go),
// every uncommitted step directory whose step is below the newest committed checkpoint's
// (abandoned attempts; only the newest generation writes, past its last commit), and every
// superseded checkpoint whose step is below the oldest kept committed checkpoint's (it lives as
// long as the one that replaced it would). Refused entries
// (RefusedStep: links, other jobs' manifests, newer formats) are never touched, and in a step
// directory only regular files are removed: a link in it is left, with the directory, and
// reported in `refused`. Stops at the first I/O error, returning it. INVALID_ARGUMENT for
// keep < 1.
// Thread contract: one pruner per job directory (the coordinator). Readers that already opened
// a pruned file keep reading it (POSIX unlink semantics).
absl::StatusOr<PruneResult> PruneCheckpoints(const Directory& root, absl::string_view job_dir,
                                             absl::string_view job_id, int keep);

// One line for an event: how many entries were refused, and the first few reasons.
std::string SummarizeRefused(const std::vector<RefusedStep>& refused);

// ---- Verification (fsck). ----

enum class CheckpointFileState {
  kOk,
  kMissing,       // no such file in the step directory
  kSizeMismatch,  // its size is not the manifest's (found without reading it)
  kCrcMismatch,   // its CRC32C is not the manifest's
  kRefused,       // a link or not a regular file: refused, never followed
  kUnreadable,    // an I/O error reading it
};

// "ok", "missing", "size mismatch", "crc mismatch", "refused", "unreadable".
absl::string_view CheckpointFileStateName(CheckpointFileState state);

struct CheckpointFileCheck {
  v1::CheckpointFile file;  // the manifest's entry
  CheckpointFileState state = CheckpointFileState::kOk;
  // OK for kOk; otherwise why, naming the path (VerifyCheckpointFile's status).
  absl::Status detail;
};

// Verifies every file of a committed checkpoint (VerifyCheckpointFile: size, then the whole
// file's CRC32C), going on past failures: one check per manifest entry, in rank order.
std::vector<CheckpointFileCheck> VerifyCheckpoint(const CommittedCheckpoint& checkpoint);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_MANIFEST_H_
