// Which job owns each checkpoint directory: a directory under the checkpoint root belongs forever
// to the first job that named it (spec.checkpoint.dir, by default the job's id), and directories
// nested inside it or above it count as its too, so no two jobs ever share checkpoint files.
#ifndef ZEROSHARD_COORDINATOR_CHECKPOINT_DIR_CLAIMS_H_
#define ZEROSHARD_COORDINATOR_CHECKPOINT_DIR_CLAIMS_H_

#include <map>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace zeroshard::coordinator {

// Directories are validated checkpoint paths (jobspec::ValidateCheckpointPath: relative, no
// empty, "." or ".." component), so equal paths are equal strings.
// Not thread-safe: its owner (JobManager) serializes access. Not persisted by itself: the jobs,
// which are never deleted, are (JobManager claims each stored job's directory when it starts).
class CheckpointDirClaims {
 public:
  // The job owning a directory that `dir` equals, lies inside, or contains; nullopt when none.
  std::optional<std::string> OwnerOf(absl::string_view dir) const;
  // Records that `job_id` owns `dir`. A directory already claimed keeps its first owner.
  void Claim(const std::string& dir, const std::string& job_id);

 private:
  // Ordered, so the claims below a directory ("dir/...") are one contiguous range.
  std::map<std::string, std::string, std::less<>> owner_by_dir_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_CHECKPOINT_DIR_CLAIMS_H_
