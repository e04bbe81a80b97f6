// Checkpoint directory claims (see the header).
#include "coordinator/checkpoint_dir_claims.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::coordinator {

std::optional<std::string> CheckpointDirClaims::OwnerOf(absl::string_view dir) const {
  // `dir` itself, or a claim above it: each of its leading component paths.
  for (size_t end = dir.find('/');; end = dir.find('/', end + 1)) {
    const absl::string_view prefix = dir.substr(0, end);
    if (auto it = owner_by_dir_.find(prefix); it != owner_by_dir_.end()) return it->second;
    if (end == absl::string_view::npos) break;
  }
  // A claim below it: the first path after "dir/" in order, if it starts so.
  const std::string below = absl::StrCat(dir, "/");
  if (auto it = owner_by_dir_.lower_bound(below);
      it != owner_by_dir_.end() && absl::StartsWith(it->first, below)) {
    return it->second;
  }
  return std::nullopt;
}

void CheckpointDirClaims::Claim(const std::string& dir, const std::string& job_id) {
  owner_by_dir_.try_emplace(dir, job_id);
}

}  // namespace zeroshard::coordinator
