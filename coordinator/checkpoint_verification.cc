// VerifyCheckpoint's answer from checkpoint::VerifyCheckpoint's checks, and export's refusal.
#include "coordinator/checkpoint_verification.h"

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zeroshard::coordinator {

v1::CheckpointFileState ToCheckpointFileState(checkpoint::CheckpointFileState state) {
  switch (state) {
    case checkpoint::CheckpointFileState::kOk:
      return v1::CHECKPOINT_FILE_OK;
    case checkpoint::CheckpointFileState::kMissing:
      return v1::CHECKPOINT_FILE_MISSING;
    case checkpoint::CheckpointFileState::kSizeMismatch:
      return v1::CHECKPOINT_FILE_SIZE_MISMATCH;
    case checkpoint::CheckpointFileState::kCrcMismatch:
      return v1::CHECKPOINT_FILE_CRC_MISMATCH;
    case checkpoint::CheckpointFileState::kRefused:
      return v1::CHECKPOINT_FILE_NOT_A_REGULAR_FILE;
    case checkpoint::CheckpointFileState::kUnreadable:
      return v1::CHECKPOINT_FILE_UNREADABLE;
  }
  return v1::CHECKPOINT_FILE_UNREADABLE;
}

v1::VerifyCheckpointResponse VerifyCommittedCheckpoint(const CommittedCheckpointSource& source) {
  v1::VerifyCheckpointResponse response;
  *response.mutable_checkpoint() = source.record;
  int32_t damaged = 0;
  for (const checkpoint::CheckpointFileCheck& check :
       checkpoint::VerifyCheckpoint(source.checkpoint)) {
    v1::CheckpointFileVerification& file = *response.add_files();
    file.set_rank(check.file.rank());
    file.set_path(absl::StrCat(source.relative_directory, "/", check.file.path()));
    file.set_expected_bytes(check.file.bytes());
    file.set_expected_crc32c(check.file.crc32c());
    file.set_state(ToCheckpointFileState(check.state));
    switch (check.state) {
      case checkpoint::CheckpointFileState::kOk:
        file.set_actual_bytes(check.file.bytes());
        file.set_actual_crc32c(check.file.crc32c());
        continue;
      case checkpoint::CheckpointFileState::kSizeMismatch:
      case checkpoint::CheckpointFileState::kCrcMismatch:
        // The check read the file as a regular one; its size is what lstat says now (the CRC32C
        // it computed is in the message).
        if (source.checkpoint.step_dir != nullptr) {
          absl::StatusOr<struct stat> found = source.checkpoint.step_dir->Stat(check.file.path());
          if (found.ok() && S_ISREG(found->st_mode)) {
            file.set_actual_bytes(static_cast<int64_t>(found->st_size));
          }
        }
        break;
      default:
        break;
    }
    ++damaged;
    file.set_message(std::string(check.detail.message()));
  }
  response.set_damaged_files(damaged);
  response.set_ok(damaged == 0);
  return response;
}

absl::Status FirstDamagedFile(const std::vector<checkpoint::CheckpointFileCheck>& checks) {
  const checkpoint::CheckpointFileCheck* first = nullptr;
  int damaged = 0;
  for (const checkpoint::CheckpointFileCheck& check : checks) {
    if (check.state == checkpoint::CheckpointFileState::kOk) continue;
    if (first == nullptr) first = &check;
    ++damaged;
  }
  if (first == nullptr) return absl::OkStatus();
  // The detail names the file by its path on the volume.
  const std::string message = absl::StrCat(
      "rank ", first->file.rank(), "'s checkpoint file is ",
      absl::StripPrefix(v1::CheckpointFileState_Name(ToCheckpointFileState(first->state)),
                        "CHECKPOINT_FILE_"),
      ": ", first->detail.message(),
      damaged > 1 ? absl::StrCat(" (", damaged, " files of the checkpoint are damaged)") : "");
  if (first->state == checkpoint::CheckpointFileState::kUnreadable && !first->detail.ok()) {
    return absl::Status(first->detail.code(), message);
  }
  return absl::DataLossError(message);
}

}  // namespace zeroshard::coordinator
