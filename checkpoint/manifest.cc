// Manifests (validated, written durably, read back), the step-directory names, and listing,
// pruning and verification of a job's checkpoint directory, all through directory descriptors.
#include "checkpoint/manifest.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <tuple>
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
constexpr absl::string_view kSupersededDirPrefix = "superseded-";
// The most checkpoints of one step SupersedeCheckpoint keeps apart.
constexpr int kMaxSupersededCopies = 99999;

// What a listing leaves alone: a refused entry, and any manifest this code may not judge (another
// job's, a newer format's, or one an errno of that code kept it from reading).
bool NotOursToTouch(const absl::Status& status) { return absl::IsFailedPrecondition(status); }

// Removes what a step directory holds, then the directory itself (an entry of `job`). Only
// regular files are removed: a link (never followed) or a subdirectory (checkpoints hold none) is
// left with the directory, and the refusal of the first one returned. I/O errors are returned
// as they are.
absl::Status RemoveStepDirectory(const Directory& job, absl::string_view name,
                                 const Directory& step_dir) {
  ZS_ASSIGN_OR_RETURN(const std::vector<DirectoryEntry> entries, step_dir.List());
  absl::Status refused;
  for (const DirectoryEntry& entry : entries) {
    if (entry.type != EntryType::kRegularFile) {
      if (refused.ok()) {
        ZS_ASSIGN_OR_RETURN(const struct stat st, step_dir.Stat(entry.name));
        refused = RefusedEntry(step_dir.PathOf(entry.name), st.st_mode, EntryType::kRegularFile);
      }
      continue;
    }
    ZS_RETURN_IF_ERROR(step_dir.Unlink(entry.name));
  }
  if (!refused.ok()) {
    return RefusedError(
        absl::StrCat("step directory ", step_dir.path(), " is left: ", refused.message()));
  }
  return job.RemoveDir(name);
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

std::string SupersededDirName(int64_t step, int copy) {
  return absl::StrCat(kSupersededDirPrefix, StepDirName(step), "-", copy);
}

std::optional<int64_t> ParseSupersededDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kSupersededDirPrefix)) return std::nullopt;
  const size_t dash = name.rfind('-');
  if (dash == absl::string_view::npos) return std::nullopt;
  const absl::string_view copy = name.substr(dash + 1);
  int parsed_copy = 0;
  if (copy.empty() || copy.size() > 5 || !absl::SimpleAtoi(copy, &parsed_copy) || parsed_copy < 1 ||
      absl::StrCat(parsed_copy) != copy) {
    return std::nullopt;
  }
  return ParseStepDirName(name.substr(0, dash));
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

absl::StatusOr<Directory> OpenStepDirectory(const Directory& root, absl::string_view job_dir,
                                            int64_t step) {
  ZS_ASSIGN_OR_RETURN(const Directory job, root.OpenPath(job_dir));
  return job.OpenChild(StepDirName(step));
}

namespace {

// Workers never write manifest.json: one already in the step directory is the job's own for
// this step (a commit retried after a coordinator restart, or a later generation checkpointing a
// step again after resuming from an earlier one: replaced) or was put there by someone else
// (refused, so that the commit fails loudly instead of replacing or trusting it). A manifest
// larger than the cap is refused from its size, unread.
absl::Status CheckNoForeignManifest(const Directory& step_dir,
                                    const v1::CheckpointManifest& manifest) {
  const absl::StatusOr<struct stat> existing = step_dir.Stat(kManifestFileName);
  if (absl::IsNotFound(existing.status())) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(existing.status());
  const std::string path = step_dir.PathOf(kManifestFileName);
  absl::Status foreign;
  if (!S_ISREG(existing->st_mode)) {
    foreign = RefusedEntry(path, existing->st_mode, EntryType::kRegularFile);
  } else {
    const absl::StatusOr<v1::CheckpointManifest> found = ReadManifest(step_dir);
    if (!found.ok()) {
      foreign = found.status();
    } else if (found->job_id() != manifest.job_id() || found->step() != manifest.step()) {
      foreign = absl::FailedPreconditionError(
          absl::StrCat(path, " is the manifest of job ", found->job_id(), " step ", found->step()));
    }
  }
  if (foreign.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot commit the checkpoint of step ", manifest.step(),
      ": the step directory already "
      "holds a manifest.json the coordinator did not write (left in place; remove it): ",
      foreign.message()));
}

}  // namespace

absl::Status WriteManifest(const Directory& root, absl::string_view job_dir,
                           v1::CheckpointManifest manifest,
                           std::function<void()> before_rename_for_testing) {
  manifest.set_format_version(kManifestFormatVersion);
  const std::string step_path =
      StepDir(job_dir.empty() ? root.path() : root.PathOf(job_dir), manifest.step());
  absl::Status valid = ValidateManifest(manifest);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest for ", step_path, ": ", valid.message()));
  }
  absl::StatusOr<Directory> step_dir = OpenStepDirectory(root, job_dir, manifest.step());
  if (!step_dir.ok()) {
    // A missing step directory is a shard the coordinator cannot see, as a missing file is.
    return absl::Status(absl::IsNotFound(step_dir.status()) ? absl::StatusCode::kFailedPrecondition
                                                            : step_dir.status().code(),
                        absl::StrCat("cannot commit the checkpoint of step ", manifest.step(), ": ",
                                     step_dir.status().message()));
  }
  for (const v1::CheckpointFile& file : manifest.files()) {
    absl::StatusOr<struct stat> st = step_dir->Stat(file.path());
    const std::string path = step_dir->PathOf(file.path());
    if (!st.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot commit rank ", file.rank(), "'s file: ", st.status().message()));
    }
    if (!S_ISREG(st->st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot commit rank ", file.rank(),
          "'s file: ", RefusedEntry(path, st->st_mode, EntryType::kRegularFile).message()));
    }
    if (static_cast<int64_t>(st->st_size) != file.bytes()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot commit rank ", file.rank(),
                                                        "'s file ", path, ": it holds ",
                                                        st->st_size, " bytes, not ", file.bytes()));
    }
  }
  ZS_RETURN_IF_ERROR(CheckNoForeignManifest(*step_dir, manifest));
  return WriteFileDurably(*step_dir, kManifestFileName,
                          ToJson(manifest, JsonStyle::kIndented) + "\n",
                          std::move(before_rename_for_testing));
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const Directory& step_dir) {
  const std::string path = step_dir.PathOf(kManifestFileName);
  ZS_ASSIGN_OR_RETURN(const File file, step_dir.OpenFile(kManifestFileName));
  ZS_ASSIGN_OR_RETURN(const uint64_t size, file.Size());
  if (size > kMaxManifestBytes) {
    // Larger than any manifest there can be: not a manifest, and never read.
    return absl::DataLossError(absl::StrCat("manifest ", path, " holds ", size,
                                            " bytes, more than the ", kMaxManifestBytes,
                                            " a manifest may hold"));
  }
  // A manifest growing past the cap while it is read fails the read (RESOURCE_EXHAUSTED).
  ZS_ASSIGN_OR_RETURN(const std::string json, ReadFileToString(file, kMaxManifestBytes));
  v1::CheckpointManifest manifest;
  ZS_RETURN_IF_ERROR(FromJson(json, path, &manifest));
  if (manifest.format_version() > kManifestFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": format_version ", manifest.format_version(),
                     " is newer than this reader's ", kManifestFormatVersion));
  }
  absl::Status valid = ValidateManifest(manifest);
  if (!valid.ok()) return absl::DataLossError(absl::StrCat(path, ": ", valid.message()));
  const std::string& dir = step_dir.path();
  const size_t slash = dir.find_last_of('/');
  const std::optional<int64_t> dir_step =
      ParseStepDirName(slash == std::string::npos ? dir : dir.substr(slash + 1));
  if (dir_step.has_value() && *dir_step != manifest.step()) {
    return absl::DataLossError(
        absl::StrCat(path, ": step ", manifest.step(), " in the directory of step ", *dir_step));
  }
  return manifest;
}

namespace {

// VerifyCheckpointFile, with the state its status stands for.
CheckpointFileCheck CheckFile(const Directory& step_dir, const v1::CheckpointFile& file) {
  CheckpointFileCheck check;
  check.file = file;
  auto fail = [&](CheckpointFileState state, absl::Status detail) {
    check.state = state;
    check.detail = std::move(detail);
    return check;
  };
  absl::StatusOr<File> opened = step_dir.OpenFile(file.path());
  if (absl::IsNotFound(opened.status())) {
    return fail(CheckpointFileState::kMissing, opened.status());
  }
  if (IsRefusal(opened.status())) return fail(CheckpointFileState::kRefused, opened.status());
  if (!opened.ok()) return fail(CheckpointFileState::kUnreadable, opened.status());
  const std::string& path = opened->path();
  auto mismatch = [&](int64_t bytes, absl::string_view crc) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint file %s: %d bytes%s, but the manifest records %d bytes with CRC32C 0x%08x",
        path, bytes, crc, file.bytes(), file.crc32c()));
  };
  absl::StatusOr<uint64_t> size = opened->Size();
  if (!size.ok()) return fail(CheckpointFileState::kUnreadable, size.status());
  if (static_cast<int64_t>(*size) != file.bytes()) {
    return fail(CheckpointFileState::kSizeMismatch, mismatch(static_cast<int64_t>(*size), ""));
  }
  std::vector<char> buffer(size_t{4} << 20);
  uint32_t crc = 0;
  int64_t bytes = 0;
  while (true) {
    const ssize_t got = ::pread(opened->fd(), buffer.data(), buffer.size(), bytes);
    if (got < 0) {
      if (errno == EINTR) continue;
      return fail(CheckpointFileState::kUnreadable, ErrnoError("read", path, errno));
    }
    if (got == 0) break;
    crc = Crc32cExtend(crc, buffer.data(), static_cast<size_t>(got));
    bytes += got;
    if (bytes > file.bytes()) break;  // it grew while being read
  }
  if (bytes != file.bytes()) {
    return fail(CheckpointFileState::kSizeMismatch,
                mismatch(bytes, absl::StrFormat(" with CRC32C 0x%08x", crc)));
  }
  if (crc != file.crc32c()) {
    return fail(CheckpointFileState::kCrcMismatch,
                mismatch(bytes, absl::StrFormat(" with CRC32C 0x%08x", crc)));
  }
  return check;
}

}  // namespace

absl::Status VerifyCheckpointFile(const Directory& step_dir, const v1::CheckpointFile& file) {
  return CheckFile(step_dir, file).detail;
}

bool IsNewerCheckpoint(const CommittedCheckpoint& a, const CommittedCheckpoint& b) {
  return CheckpointOrder(a.generation(), a.step) > CheckpointOrder(b.generation(), b.step);
}

namespace {

// Adds the superseded checkpoint in `name` of `job` to the listing, unless it is not the job's
// own (a link or not a directory, another job's or a newer format's manifest) or holds no
// manifest that reads (a crash between its rename and its mark is not one: that manifest reads):
// those are left out, untouched. I/O errors are returned.
absl::Status ListSuperseded(const Directory& job, const std::string& name, int64_t step,
                            std::optional<absl::string_view> job_id, CheckpointListing* listing) {
  absl::StatusOr<Directory> dir = job.OpenChild(name);
  if (NotOursToTouch(dir.status()) || absl::IsNotFound(dir.status())) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(dir.status());
  auto held = std::make_shared<const Directory>(*std::move(dir));
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(*held);
  if (NotOursToTouch(manifest.status()) || absl::IsNotFound(manifest.status()) ||
      absl::IsDataLoss(manifest.status())) {
    return absl::OkStatus();
  }
  ZS_RETURN_IF_ERROR(manifest.status());
  if (manifest->step() != step || (job_id.has_value() && manifest->job_id() != *job_id)) {
    return absl::OkStatus();
  }
  listing->superseded.push_back(
      {step, name, job.PathOf(name), *std::move(manifest), std::move(held)});
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointListing> ListCheckpoints(const Directory& root, absl::string_view job_dir,
                                                  std::optional<absl::string_view> job_id) {
  if (job_id.has_value() && job_id->empty()) {
    return absl::InvalidArgumentError("job_id: empty (std::nullopt accepts every job's)");
  }
  CheckpointListing listing;
  absl::StatusOr<Directory> job = root.OpenPath(job_dir);
  if (absl::IsNotFound(job.status())) return listing;
  if (!job.ok()) return job.status();
  ZS_ASSIGN_OR_RETURN(const std::vector<DirectoryEntry> entries, job->List());
  for (const DirectoryEntry& entry : entries) {
    if (const std::optional<int64_t> retired = ParseSupersededDirName(entry.name)) {
      ZS_RETURN_IF_ERROR(ListSuperseded(*job, entry.name, *retired, job_id, &listing));
      continue;
    }
    const std::optional<int64_t> step = ParseStepDirName(entry.name);
    if (!step.has_value()) continue;
    const std::string directory = job->PathOf(entry.name);
    absl::StatusOr<Directory> step_dir = job->OpenChild(entry.name);
    if (NotOursToTouch(step_dir.status())) {
      listing.refused.push_back({*step, directory, step_dir.status()});
      continue;
    }
    if (absl::IsNotFound(step_dir.status())) continue;  // removed since the listing
    if (!step_dir.ok()) return step_dir.status();
    auto held = std::make_shared<const Directory>(*std::move(step_dir));
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(*held);
    if (manifest.ok() && job_id.has_value() && manifest->job_id() != *job_id) {
      manifest = RefusedError(absl::StrCat(held->PathOf(kManifestFileName), " belongs to job \"",
                                           absl::CHexEscape(manifest->job_id()), "\", not to ",
                                           *job_id, ": not this job's checkpoint, left alone"));
    }
    if (manifest.ok() && manifest->has_superseded()) {
      listing.superseded.push_back(
          {*step, entry.name, directory, *std::move(manifest), std::move(held)});
      continue;
    }
    if (manifest.ok()) {
      listing.committed.push_back({*step, directory, *std::move(manifest), std::move(held)});
      continue;
    }
    // A link, another job's manifest or a newer format: not this code's to judge or delete.
    if (NotOursToTouch(manifest.status())) {
      listing.refused.push_back({*step, directory, manifest.status()});
      continue;
    }
    // Anything but "no manifest" or "not a valid one" may be a passing I/O error: a checkpoint
    // must not be taken for an abandoned attempt (and pruned) because of one.
    if (!absl::IsNotFound(manifest.status()) && !absl::IsDataLoss(manifest.status())) {
      return manifest.status();
    }
    listing.uncommitted.push_back({*step, directory, manifest.status(), std::move(held)});
  }
  std::sort(listing.committed.begin(), listing.committed.end(), IsNewerCheckpoint);
  std::sort(listing.uncommitted.begin(), listing.uncommitted.end(),
            [](const UncommittedStep& a, const UncommittedStep& b) { return a.step > b.step; });
  std::sort(listing.refused.begin(), listing.refused.end(),
            [](const RefusedStep& a, const RefusedStep& b) { return a.step > b.step; });
  std::sort(listing.superseded.begin(), listing.superseded.end(),
            [](const SupersededCheckpoint& a, const SupersededCheckpoint& b) {
              const auto when = [](const SupersededCheckpoint& c) {
                const google::protobuf::Timestamp& time = c.manifest.superseded().time();
                return std::make_tuple(c.step, time.seconds(), time.nanos(), c.name);
              };
              return when(a) > when(b);
            });
  return listing;
}

absl::StatusOr<CommittedCheckpoint> OpenCommittedCheckpoint(
    const Directory& root, absl::string_view job_dir, int64_t step,
    std::optional<absl::string_view> job_id) {
  ZS_ASSIGN_OR_RETURN(Directory step_dir, OpenStepDirectory(root, job_dir, step));
  return ReadCommittedCheckpoint(std::move(step_dir), step, job_id);
}

absl::StatusOr<CommittedCheckpoint> ReadCommittedCheckpoint(
    Directory step_dir, int64_t step, std::optional<absl::string_view> job_id) {
  ZS_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadManifest(step_dir));
  if (manifest.step() != step) {
    return absl::DataLossError(absl::StrCat(step_dir.PathOf(kManifestFileName), ": step ",
                                            manifest.step(), ", not ", step));
  }
  if (job_id.has_value() && manifest.job_id() != *job_id) {
    return RefusedError(absl::StrCat(step_dir.PathOf(kManifestFileName), " belongs to job \"",
                                     absl::CHexEscape(manifest.job_id()), "\", not to ", *job_id));
  }
  if (manifest.has_superseded()) {
    return RefusedError(absl::StrCat(
        step_dir.PathOf(kManifestFileName), " was superseded: job ", manifest.job_id(),
        " went back to step ", manifest.superseded().loaded_step(), " in generation ",
        manifest.superseded().generation(), " (", manifest.superseded().reason(), ")"));
  }
  std::string directory = step_dir.path();
  return CommittedCheckpoint{step, std::move(directory), std::move(manifest),
                             std::make_shared<const Directory>(std::move(step_dir))};
}

absl::StatusOr<std::string> SupersedeCheckpoint(const Directory& root, absl::string_view job_dir,
                                                const CommittedCheckpoint& checkpoint,
                                                const v1::CheckpointSupersession& why) {
  if (checkpoint.step_dir == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(checkpoint.directory, ": not opened (ListCheckpoints opens checkpoints)"));
  }
  ZS_ASSIGN_OR_RETURN(const Directory job, root.OpenPath(job_dir));
  std::string to;
  for (int copy = 1;; ++copy) {
    if (copy > kMaxSupersededCopies) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot retire ", checkpoint.directory, ": ", kMaxSupersededCopies,
                       " superseded checkpoints of step ", checkpoint.step, " are there already"));
    }
    to = SupersededDirName(checkpoint.step, copy);
    const absl::StatusOr<struct stat> taken = job.Stat(to);
    if (absl::IsNotFound(taken.status())) break;
    ZS_RETURN_IF_ERROR(taken.status());
  }
  ZS_RETURN_IF_ERROR(job.Rename(StepDirName(checkpoint.step), to));
  ZS_RETURN_IF_ERROR(job.Sync());
  // The directory renamed must be the one the checkpoint was read from: the mark goes through
  // the descriptor held since then.
  struct stat held;
  if (::fstat(checkpoint.step_dir->fd(), &held) != 0) {
    return ErrnoError("fstat", checkpoint.directory, errno);
  }
  ZS_ASSIGN_OR_RETURN(const struct stat renamed, job.Stat(to));
  if (held.st_dev != renamed.st_dev || held.st_ino != renamed.st_ino) {
    return RefusedError(absl::StrCat(job.PathOf(to), " (renamed from ", checkpoint.directory,
                                     ") is not the directory the checkpoint was read from: it "
                                     "changed since it was listed; its manifest is left unmarked"));
  }
  v1::CheckpointManifest marked = checkpoint.manifest;
  *marked.mutable_superseded() = why;
  ZS_RETURN_IF_ERROR(WriteFileDurably(*checkpoint.step_dir, kManifestFileName,
                                      ToJson(marked, JsonStyle::kIndented) + "\n"));
  return job.PathOf(to);
}

absl::StatusOr<PruneResult> PruneCheckpoints(const Directory& root, absl::string_view job_dir,
                                             absl::string_view job_id, int keep) {
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("keep: ", keep, " < 1"));
  ZS_ASSIGN_OR_RETURN(CheckpointListing listing, ListCheckpoints(root, job_dir, job_id));
  PruneResult result;
  result.refused = std::move(listing.refused);
  if (listing.committed.empty()) return result;
  ZS_ASSIGN_OR_RETURN(const Directory job, root.OpenPath(job_dir));
  const int64_t newest = listing.committed.front().step;
  bool removed = false;
  auto remove = [&](int64_t step, const std::string& directory,
                    const Directory& step_dir) -> absl::StatusOr<bool> {
    absl::Status status = RemoveStepDirectory(job, StepDirName(step), step_dir);
    if (IsRefusal(status)) {
      result.refused.push_back({step, directory, std::move(status)});
      return false;
    }
    ZS_RETURN_IF_ERROR(status);
    removed = true;
    return true;
  };
  // Oldest first, so that an error part-way leaves the newest ones.
  for (auto it = listing.committed.rbegin();
       it != listing.committed.rend() && listing.committed.rend() - it > keep; ++it) {
    ZS_RETURN_IF_ERROR(it->step_dir->Unlink(kManifestFileName));
    ZS_RETURN_IF_ERROR(it->step_dir->Sync());
    removed = true;
    ZS_ASSIGN_OR_RETURN(const bool gone, remove(it->step, it->directory, *it->step_dir));
    if (gone) result.deleted_committed.push_back(it->step);
  }
  for (auto it = listing.uncommitted.rbegin(); it != listing.uncommitted.rend(); ++it) {
    if (it->step >= newest) break;
    ZS_ASSIGN_OR_RETURN(const bool gone, remove(it->step, it->directory, *it->step_dir));
    if (gone) result.deleted_uncommitted.push_back(it->step);
  }
  // The oldest committed checkpoint kept.
  const size_t kept = std::min(listing.committed.size(), static_cast<size_t>(keep));
  const int64_t oldest_kept = listing.committed[kept - 1].step;
  for (auto it = listing.superseded.rbegin(); it != listing.superseded.rend(); ++it) {
    if (it->step >= oldest_kept) break;
    absl::Status status = RemoveStepDirectory(job, it->name, *it->step_dir);
    if (IsRefusal(status)) {
      result.refused.push_back({it->step, it->directory, std::move(status)});
      continue;
    }
    ZS_RETURN_IF_ERROR(status);
    removed = true;
    result.deleted_superseded.push_back(it->step);
  }
  if (removed) ZS_RETURN_IF_ERROR(job.Sync());
  return result;
}

std::string SummarizeRefused(const std::vector<RefusedStep>& refused) {
  constexpr size_t kListed = 3;
  std::string summary =
      absl::StrCat(refused.size(), " step ", refused.size() == 1 ? "entry" : "entries",
                   " refused and left alone: ");
  for (size_t i = 0; i < refused.size() && i < kListed; ++i) {
    absl::StrAppend(&summary, i > 0 ? "; " : "", refused[i].reason.message());
  }
  if (refused.size() > kListed)
    absl::StrAppend(&summary, "; and ", refused.size() - kListed, " more");
  return summary;
}

absl::string_view CheckpointFileStateName(CheckpointFileState state) {
  switch (state) {
    case CheckpointFileState::kOk:
      return "ok";
    case CheckpointFileState::kMissing:
      return "missing";
    case CheckpointFileState::kSizeMismatch:
      return "size mismatch";
    case CheckpointFileState::kCrcMismatch:
      return "crc mismatch";
    case CheckpointFileState::kRefused:
      return "refused";
    case CheckpointFileState::kUnreadable:
      return "unreadable";
  }
  return "?";
}

std::vector<CheckpointFileCheck> VerifyCheckpoint(const CommittedCheckpoint& checkpoint) {
  std::vector<const v1::CheckpointFile*> files;
  for (const v1::CheckpointFile& file : checkpoint.manifest.files()) files.push_back(&file);
  std::sort(files.begin(), files.end(),
            [](const v1::CheckpointFile* a, const v1::CheckpointFile* b) {
              return a->rank() < b->rank();
            });
  std::vector<CheckpointFileCheck> checks;
  checks.reserve(files.size());
  for (const v1::CheckpointFile* file : files) {
    if (checkpoint.step_dir == nullptr) {
      CheckpointFileCheck check;
      check.file = *file;
      check.state = CheckpointFileState::kUnreadable;
      check.detail = absl::InvalidArgumentError(
          absl::StrCat(checkpoint.directory,
                       ": not opened (ListCheckpoints and OpenCommittedCheckpoint open "
                       "checkpoints)"));
      checks.push_back(std::move(check));
      continue;
    }
    checks.push_back(CheckFile(*checkpoint.step_dir, *file));
  }
  return checks;
}

}  // namespace zeroshard::checkpoint
