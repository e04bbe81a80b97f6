// POSIX file helpers for checkpoints: files written under a temporary name and made durable
// (fsync, rename, fsync of the directory) in one step, full preads, and errno statuses.
#ifndef ZEROSHARD_CHECKPOINT_FILE_IO_H_
#define ZEROSHARD_CHECKPOINT_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::checkpoint {

// "<operation> <path>: <strerror(error_number)>", with the code absl maps errno to (ENOSPC:
// RESOURCE_EXHAUSTED, EFBIG: OUT_OF_RANGE, ENOENT: NOT_FOUND, EACCES: PERMISSION_DENIED, ...).
absl::Status ErrnoError(absl::string_view operation, absl::string_view path, int error_number);

// The directory part of `path` ("." when it has none).
std::string DirectoryOf(absl::string_view path);

// fsync of a directory, so that renames and unlinks in it survive a crash.
absl::Status SyncDirectory(const std::string& directory);

// A file that only appears under its final name once complete and on disk. It is written as
// "<dir>/.<name>.tmp-<pid>-<random>" in the final name's directory (readers ignore dot files);
// Commit() flushes, fsyncs and closes it, renames it to the final name and fsyncs the directory.
// Until then, and after any error, the final name is untouched: destroying an uncommitted
// DurableFile removes the temporary file. After an error every call returns that error.
// Thread contract: not thread-safe; one owner calls it (the checkpoint writer's thread).
class DurableFile {
 public:
  // Creates the temporary file (the directory must exist), under a name no other writer on any
  // host shares.
  static absl::StatusOr<std::unique_ptr<DurableFile>> Create(std::string final_path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  const std::string& final_path() const { return final_path_; }
  const std::string& temp_path() const { return temp_path_; }
  // Bytes appended so far.
  uint64_t size() const { return size_; }

  // Appends bytes (through a buffer: small appends cost no system call).
  absl::Status Append(const void* data, size_t n);
  // Overwrites bytes already appended: [offset, offset + n) must lie within size().
  absl::Status OverwriteAt(uint64_t offset, const void* data, size_t n);
  // Makes the file durable under its final name (see the class comment). At most once.
  absl::Status Commit();

  // Tests simulate a crash here: called after the temporary file is fsynced and closed, before
  // the rename.
  void SetBeforeRenameHookForTesting(std::function<void()> hook) {
    before_rename_hook_ = std::move(hook);
  }

 private:
  DurableFile(std::string final_path, std::string temp_path, int fd);
  absl::Status Flush();
  absl::Status WriteFully(const char* data, size_t n);
  // Records the first error; every later call returns it.
  absl::Status Fail(absl::Status status);

  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::vector<char> buffer_;  // appended bytes not yet written; at most kBufferBytes
  absl::Status error_;
  bool committed_ = false;
  std::function<void()> before_rename_hook_;
};

// Writes `contents` to `path` as DurableFile does: a reader sees the old file (or none) or the
// new one, never a part. `before_rename_for_testing` as in SetBeforeRenameHookForTesting.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents,
                              std::function<void()> before_rename_for_testing = nullptr);

// Reads exactly n bytes at `offset` of `fd`; OUT_OF_RANGE naming `path` when the file ends
// first, an errno status otherwise.
absl::Status PreadFully(int fd, const std::string& path, uint64_t offset, void* out, size_t n);

// The whole file. NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_FILE_IO_H_
