// The commit record of a checkpoint and the directory layout around it: manifest.json, which the
// coordinator writes last, and the functions that name, list and prune step directories.
//
// Layout: <checkpoint root>/<policy dir>/step-<12-digit step>/ holds one
// rank-<5-digit rank>-of-<5-digit world size>.safetensors per rank (shard_file.h) and then
// manifest.json. A step directory without a valid manifest is not a checkpoint: readers skip
// it, and pruning deletes it once a newer checkpoint is committed.
#ifndef ZEROSHARD_CHECKPOINT_MANIFEST_H_
#define ZEROSHARD_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {

inline constexpr int32_t kManifestFormatVersion = 1;
inline constexpr char kManifestFileName[] = "manifest.json";
// The largest world size the file names hold (5 digits).
inline constexpr int32_t kMaxNamedWorldSize = 99999;

// ---- Names: the only place that spells them. ----

// "<root>/<policy_dir>": one job's checkpoints (policy_dir is CheckpointPolicy.dir, already
// validated as relative without "..").
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

// ---- The manifest. ----

// INVALID_ARGUMENT naming the field: format_version other than kManifestFormatVersion; empty
// job_id; step or generation < 0; world_size outside [1, kMaxNamedWorldSize]; files not one per
// rank of [0, world_size); a path that is not a plain file name (empty, ".", "..", or with a
// '/'); bytes < 8 (no safetensors file is smaller); no commit_time.
absl::Status ValidateManifest(const v1::CheckpointManifest& manifest);

// Commits the checkpoint in `step_dir`: sets format_version, validates (ValidateManifest),
// checks that every listed file exists there with the listed size (FAILED_PRECONDITION naming
// it otherwise, e.g. a shard the coordinator cannot see), then writes manifest.json durably:
// temporary file, fsync, rename, fsync of the directory (WriteFileDurably). Until the rename
// completes readers see no checkpoint; after it returns OK the commit survives a crash.
// `before_rename_for_testing` lets tests crash between the fsync and the rename.
// Thread contract: one writer per step directory (the coordinator).
absl::Status WriteManifest(const std::string& step_dir, v1::CheckpointManifest manifest,
                           std::function<void()> before_rename_for_testing = nullptr);

// The manifest of `step_dir`. NOT_FOUND when it has none; DATA_LOSS naming the path when it is
// not a valid manifest (ValidateManifest) or its step is not the directory's; FAILED_PRECONDITION
// for a format_version this reader does not know; an errno status for I/O errors.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir);

// Reads `file` of `step_dir` whole and checks its size and CRC32C against the manifest entry:
// DATA_LOSS naming the file and both values on a mismatch. Costs a full read (export and fsck
// use it; loads rely on the per-fragment checksums instead).
absl::Status VerifyCheckpointFile(const std::string& step_dir, const v1::CheckpointFile& file);

// ---- Listing and pruning. ----

struct CommittedCheckpoint {
  int64_t step = 0;
  std::string directory;  // the step directory
  v1::CheckpointManifest manifest;
};

// A step directory that is not a checkpoint, and why (NOT_FOUND: no manifest yet, or the
// checkpoint was abandoned; DATA_LOSS or FAILED_PRECONDITION: ReadManifest refused it).
struct UncommittedStep {
  int64_t step = 0;
  std::string directory;
  absl::Status reason;
};

struct CheckpointListing {
  std::vector<CommittedCheckpoint> committed;  // newest first
  std::vector<UncommittedStep> uncommitted;    // newest first
};

// The step directories of a job directory (entries not named like one are ignored). A missing
// job directory lists nothing. An I/O error reading a directory or a manifest (other than a
// missing manifest) fails the listing rather than passing a checkpoint off as uncommitted.
// Thread contract: safe to call concurrently with writers and other readers.
absl::StatusOr<CheckpointListing> ListCheckpoints(const std::string& job_dir);

struct PruneResult {
  std::vector<int64_t> deleted_committed;    // oldest first
  std::vector<int64_t> deleted_uncommitted;  // oldest first
};

// Keeps the `keep` newest committed checkpoints: deletes the older committed ones (manifest
// first, so each stops being a checkpoint before its files go) and every uncommitted step
// directory older than the newest committed checkpoint (abandoned attempts; newer ones may still
// be being written), except those whose manifest has a newer format_version. Stops at the first
// error, returning it. INVALID_ARGUMENT for keep < 1.
// Thread contract: one pruner per job directory (the coordinator). Readers that already opened
// a pruned file keep reading it (POSIX unlink semantics).
absl::StatusOr<PruneResult> PruneCheckpoints(const std::string& job_dir, int keep);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_MANIFEST_H_
