// File helpers for checkpoints, on the descriptors of directory.h: files written under a
// temporary name and made durable (fsync, rename, fsync of the directory) in one step, full
// preads, and whole-file reads with a cap. ErrnoError comes from directory.h.
#ifndef ZEROSHARD_CHECKPOINT_FILE_IO_H_
#define ZEROSHARD_CHECKPOINT_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/directory.h"

namespace zeroshard::checkpoint {

// No cap on what ReadFileToString reads.
inline constexpr uint64_t kNoSizeLimit = std::numeric_limits<uint64_t>::max();

// The directory part of `path` ("." when it has none).
std::string DirectoryOf(absl::string_view path);

// A file that only appears under its final name once complete and on disk. It is written as
// ".<name>.tmp-<pid>-<random>" in the final name's directory (readers ignore dot files), created
// with O_EXCL (a link planted under that name is never followed: another name is tried);
// Commit() flushes, fsyncs and closes it, renames it to the final name and fsyncs the directory,
// all relative to the directory's descriptor (directory.h). Until then, and after any error, the
// final name is untouched: destroying an uncommitted DurableFile removes the temporary file.
// After an error every call returns that error. The directory's StorageHooks see every write,
// fsync and rename.
// Thread contract: not thread-safe; one owner calls it (the checkpoint writer's thread).
class DurableFile {
 public:
  // Creates the temporary file in `directory` (held open by the DurableFile through a descriptor
  // of its own), under a name no other writer on any host shares; the final name is `name` there.
  static absl::StatusOr<std::unique_ptr<DurableFile>> Create(const Directory& directory,
                                                             std::string name);
  // The same in the directory of `final_path`, which is opened by path as a trusted root
  // (Directory::OpenRoot): for files outside the checkpoint volume, such as the export a client
  // writes where its user asked. The final name itself is never followed.
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
  // Makes the file durable under its final name (see the class comment). At most once. An
  // existing entry of the final name that is not a regular file (a link, a directory) is refused
  // (FAILED_PRECONDITION naming it), not replaced.
  absl::Status Commit();

  // Tests simulate a crash here: called after the temporary file is fsynced and closed, before
  // the rename.
  void SetBeforeRenameHookForTesting(std::function<void()> hook) {
    before_rename_hook_ = std::move(hook);
  }

 private:
  DurableFile(Directory directory, std::string name, std::string temp_name, File file);
  absl::Status Flush();
  absl::Status WriteFully(const char* data, size_t n);
  // Records the first error; every later call returns it.
  absl::Status Fail(absl::Status status);

  Directory directory_;  // where both names live
  std::string name_;
  std::string temp_name_;
  std::string final_path_;  // for messages
  std::string temp_path_;
  File file_;  // the temporary file until Commit() closes it
  uint64_t size_ = 0;
  std::vector<char> buffer_;  // appended bytes not yet written; at most kBufferBytes
  absl::Status error_;
  bool committed_ = false;
  std::function<void()> before_rename_hook_;
};

// Writes `contents` to `name` of `directory` as DurableFile does: a reader sees the old file (or
// none) or the new one, never a part. `before_rename_for_testing` as in
// SetBeforeRenameHookForTesting.
absl::Status WriteFileDurably(const Directory& directory, std::string name,
                              absl::string_view contents,
                              std::function<void()> before_rename_for_testing = nullptr);
// The same by path (DurableFile::Create(final_path): the path's directory is trusted).
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents,
                              std::function<void()> before_rename_for_testing = nullptr);

// Reads exactly n bytes at `offset` of `fd`; OUT_OF_RANGE naming `path` when the file ends
// first, an errno status otherwise.
absl::Status PreadFully(int fd, const std::string& path, uint64_t offset, void* out, size_t n);

// The whole of an open file. A file of more than `max_bytes` is RESOURCE_EXHAUSTED naming the
// path, its size and the cap, found with fstat before anything is read (a sparse file of 20 GB
// costs nothing), and a file growing past the cap while it is read stops the read there.
absl::StatusOr<std::string> ReadFileToString(const File& file, uint64_t max_bytes);
// The regular file `name` of `directory` whole (Directory::OpenFile: a link is refused).
// NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const Directory& directory, absl::string_view name,
                                             uint64_t max_bytes = kNoSizeLimit);
// The same by path: its directory is opened as a trusted root, the file's name is not followed.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             uint64_t max_bytes = kNoSizeLimit);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_FILE_IO_H_
