// Manifests (validated, written durably, read back), the step-directory names, and listing and
// pruning of a job's checkpoint directory.
#include "checkpoint/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/proto_json.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

constexpr absl::string_view kStepDirPrefix = "step-";
constexpr int kStepDigits = 12;

// The names in a directory, without "." and "..". An errno status when it cannot be read
// (NOT_FOUND when it does not exist).
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return ErrnoError("open directory", directory, errno);
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      const int error = errno;
      ::closedir(dir);
      if (error != 0) return ErrnoError("read directory", directory, error);
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  return names;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Removes a step directory and everything in it (files only: checkpoints hold no
// subdirectories, so one is an error rather than something to delete blindly).
absl::Status RemoveStepDirectory(const std::string& directory) {
  ZS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(directory));
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(directory, "/", name);
    if (::unlink(path.c_str()) != 0) return ErrnoError("unlink", path, errno);
  }
  if (::rmdir(directory.c_str()) != 0) return ErrnoError("rmdir", directory, errno);
  return absl::OkStatus();
}

}  // namespace

std::string JobCheckpointDir(absl::string_view root, absl::string_view policy_dir) {
  return absl::StrCat(root, "/", policy_dir);
}

std::string StepDirName(int64_t step) {
  return absl::StrFormat("%s%0*d", kStepDirPrefix, kStepDigits, step);
}

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepDirPrefix) || name.size() < kStepDigits) return std::nullopt;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t step;
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;
  // One spelling per step: "step-0000000000012" (13 digits) is not step 12's directory.
  if (StepDirName(step) != absl::StrCat(kStepDirPrefix, name)) return std::nullopt;
  return step;
}

std::string StepDir(absl::string_view job_dir, int64_t step) {
  return absl::StrCat(job_dir, "/", StepDirName(step));
}

std::string ShardFileName(int32_t rank, int32_t world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world_size);
}

std::string ManifestPath(absl::string_view step_dir) {
  return absl::StrCat(step_dir, "/", kManifestFileName);
}

absl::Status ValidateManifest(const v1::CheckpointManifest& manifest) {
  if (manifest.format_version() != kManifestFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("format_version: ", manifest.format_version(),
                                                   ", not ", kManifestFormatVersion));
  }
  if (manifest.job_id().empty()) return absl::InvalidArgumentError("job_id: empty");
  if (manifest.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", manifest.step(), " < 0"));
  }
  if (manifest.generation() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("generation: ", manifest.generation(), " < 0"));
  }
  if (manifest.world_size() < 1 || manifest.world_size() > kMaxNamedWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", manifest.world_size(),
                                                   " outside [1, ", kMaxNamedWorldSize, "]"));
  }
  if (manifest.files_size() != manifest.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "files: ", manifest.files_size(), " files for world_size ", manifest.world_size()));
  }
  std::vector<bool> seen(manifest.world_size(), false);
  for (int i = 0; i < manifest.files_size(); ++i) {
    const v1::CheckpointFile& file = manifest.files(i);
    const std::string where = absl::StrCat("files[", i, "]");
    if (file.rank() < 0 || file.rank() >= manifest.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".rank: ", file.rank(), " outside [0, ", manifest.world_size(), ")"));
    }
    if (seen[file.rank()]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".rank: rank ", file.rank(), " is listed twice"));
    }
    seen[file.rank()] = true;
    const std::string& path = file.path();
    if (path.empty() || path == "." || path == ".." || absl::StrContains(path, '/')) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".path: \"", absl::CHexEscape(path), "\" is not a file name"));
    }
    if (file.bytes() < 8) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".bytes: ", file.bytes(), " is too small for a safetensors file"));
    }
  }
  if (!manifest.has_commit_time()) return absl::InvalidArgumentError("commit_time: unset");
  return absl::OkStatus();
}

absl::Status WriteManifest(const std::string& step_dir, v1::CheckpointManifest manifest,
                           std::function<void()> before_rename_for_testing) {
  manifest.set_format_version(kManifestFormatVersion);
  absl::Status valid = ValidateManifest(manifest);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest for ", step_dir, ": ", valid.message()));
  }
  for (const v1::CheckpointFile& file : manifest.files()) {
    const std::string path = absl::StrCat(step_dir, "/", file.path());
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      const absl::Status missing = ErrnoError("stat", path, errno);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot commit rank ", file.rank(), "'s file: ", missing.message()));
    }
    if (static_cast<int64_t>(st.st_size) != file.bytes()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot commit rank ", file.rank(),
                                                        "'s file ", path, ": it holds ", st.st_size,
                                                        " bytes, not ", file.bytes()));
    }
  }
  return WriteFileDurably(ManifestPath(step_dir), ToJson(manifest, JsonStyle::kIndented) + "\n",
                          std::move(before_rename_for_testing));
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir) {
  const std::string path = ManifestPath(step_dir);
  ZS_ASSIGN_OR_RETURN(const std::string json, ReadFileToString(path));
  v1::CheckpointManifest manifest;
  ZS_RETURN_IF_ERROR(FromJson(json, path, &manifest));
  if (manifest.format_version() > kManifestFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": format_version ", manifest.format_version(),
                     " is newer than this reader's ", kManifestFormatVersion));
  }
  absl::Status valid = ValidateManifest(manifest);
  if (!valid.ok()) return absl::DataLossError(absl::StrCat(path, ": ", valid.message()));
  const size_t slash = step_dir.find_last_of('/');
  const std::optional<int64_t> dir_step =
      ParseStepDirName(slash == std::string::npos ? step_dir : step_dir.substr(slash + 1));
  if (dir_step.has_value() && *dir_step != manifest.step()) {
    return absl::DataLossError(
        absl::StrCat(path, ": step ", manifest.step(), " in the directory of step ", *dir_step));
  }
  return manifest;
}

absl::Status VerifyCheckpointFile(const std::string& step_dir, const v1::CheckpointFile& file) {
  const std::string path = absl::StrCat(step_dir, "/", file.path());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  std::vector<char> buffer(size_t{4} << 20);
  uint32_t crc = 0;
  int64_t bytes = 0;
  absl::Status status;
  while (true) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      status = ErrnoError("read", path, errno);
      break;
    }
    if (got == 0) break;
    crc = Crc32cExtend(crc, buffer.data(), static_cast<size_t>(got));
    bytes += got;
  }
  ::close(fd);
  ZS_RETURN_IF_ERROR(status);
  if (bytes != file.bytes() || crc != file.crc32c()) {
    return absl::DataLossError(
        absl::StrFormat("checkpoint file %s: %d bytes with CRC32C 0x%08x, but the manifest "
                        "records %d bytes with CRC32C 0x%08x",
                        path, bytes, crc, file.bytes(), file.crc32c()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointListing> ListCheckpoints(const std::string& job_dir) {
  CheckpointListing listing;
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(job_dir);
  if (absl::IsNotFound(names.status())) return listing;
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const std::optional<int64_t> step = ParseStepDirName(name);
    const std::string directory = absl::StrCat(job_dir, "/", name);
    if (!step.has_value() || !IsDirectory(directory)) continue;
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(directory);
    if (manifest.ok()) {
      listing.committed.push_back({*step, directory, *std::move(manifest)});
      continue;
    }
    const absl::StatusCode code = manifest.status().code();
    // Anything but "no manifest" or "not a valid one" may be a passing I/O error: a checkpoint
    // must not be taken for an abandoned attempt (and pruned) because of one.
    if (code != absl::StatusCode::kNotFound && code != absl::StatusCode::kDataLoss &&
        code != absl::StatusCode::kFailedPrecondition) {
      return manifest.status();
    }
    listing.uncommitted.push_back({*step, directory, manifest.status()});
  }
  std::sort(
      listing.committed.begin(), listing.committed.end(),
      [](const CommittedCheckpoint& a, const CommittedCheckpoint& b) { return a.step > b.step; });
  std::sort(listing.uncommitted.begin(), listing.uncommitted.end(),
            [](const UncommittedStep& a, const UncommittedStep& b) { return a.step > b.step; });
  return listing;
}

absl::StatusOr<PruneResult> PruneCheckpoints(const std::string& job_dir, int keep) {
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("keep: ", keep, " < 1"));
  ZS_ASSIGN_OR_RETURN(CheckpointListing listing, ListCheckpoints(job_dir));
  PruneResult result;
  if (listing.committed.empty()) return result;
  const int64_t newest = listing.committed.front().step;
  // Oldest first, so that an error part-way leaves the newest ones.
  for (auto it = listing.committed.rbegin();
       it != listing.committed.rend() && listing.committed.rend() - it > keep; ++it) {
    const std::string manifest = ManifestPath(it->directory);
    if (::unlink(manifest.c_str()) != 0) return ErrnoError("unlink", manifest, errno);
    ZS_RETURN_IF_ERROR(SyncDirectory(it->directory));
    ZS_RETURN_IF_ERROR(RemoveStepDirectory(it->directory));
    result.deleted_committed.push_back(it->step);
  }
  for (auto it = listing.uncommitted.rbegin(); it != listing.uncommitted.rend(); ++it) {
    if (it->step >= newest) break;
    // A manifest of a newer format is a checkpoint this code cannot judge: leave it.
    if (absl::IsFailedPrecondition(it->reason)) continue;
    ZS_RETURN_IF_ERROR(RemoveStepDirectory(it->directory));
    result.deleted_uncommitted.push_back(it->step);
  }
  if (!result.deleted_committed.empty() || !result.deleted_uncommitted.empty()) {
    ZS_RETURN_IF_ERROR(SyncDirectory(job_dir));
  }
  return result;
}

}  // namespace zeroshard::checkpoint
