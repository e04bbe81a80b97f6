// The checkpoint volume's system-call boundary: directories held as descriptors and walked one
// component at a time from a trusted root without following links, files opened and created
// relative to them, errno statuses, and the hooks through which tests watch or block storage.
#ifndef ZEROSHARD_CHECKPOINT_DIRECTORY_H_
#define ZEROSHARD_CHECKPOINT_DIRECTORY_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
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

// What a StorageHooks is told is about to happen.
enum class StorageOperation {
  kOpen,             // a directory or a file opened for reading (a walk opens each component)
  kList,             // a directory's entries read
  kStat,             // one entry's metadata read
  kMakeDirectory,    // a directory created
  kCreate,           // a file created
  kWrite,            // bytes written to a created file (each write system call of DurableFile)
  kSync,             // fsync of a file or of a directory
  kRename,           // an entry renamed within its directory (the path is the new name)
  kUnlink,           // a file (or a link, never its target) removed
  kRemoveDirectory,  // an empty directory removed
};

// "open", "list", "stat", "mkdir", "create", "write", "fsync", "rename", "unlink", "rmdir".
absl::string_view StorageOperationName(StorageOperation operation);

// Sees every storage operation on a root and on everything opened from it (Directory::OpenRoot
// takes it; directories and files opened from a directory inherit it). The seam of tests that
// hold the coordinator's commit in its manifest write, or fail an fsync: production passes none.
// Thread contract: called on the thread doing the operation, from any number of threads at once;
// implementations synchronize themselves and must not call back into the operation's Directory.
class StorageHooks {
 public:
  virtual ~StorageHooks() = default;
  // Called before `operation` on `path` (the full path, as messages spell it). It may block. A
  // non-OK status fails the operation with that status before it touches the volume.
  virtual absl::Status Before(StorageOperation operation, const std::string& path) = 0;
};

// What an entry of a directory is, by lstat (links are never resolved).
enum class EntryType { kDirectory, kRegularFile, kSymlink, kOther };
EntryType EntryTypeOf(mode_t mode);
// "a directory", "a regular file", "a symbolic link", "a FIFO", "a socket", "a device", ...
std::string DescribeFileType(mode_t mode);

// The refusal of an entry that is not what was expected: FAILED_PRECONDITION "<path> is a
// symbolic link, where a directory is expected: refused (checkpoint storage never follows
// links)". Every refusal of this layer has this form and code, and carries a payload that
// IsRefusal() recognises (some errno statuses share the code: ENOTDIR, ENOTEMPTY, EBUSY).
absl::Status RefusedEntry(absl::string_view path, mode_t mode, EntryType expected);
// FAILED_PRECONDITION with `message`, marked as a refusal (for layers that refuse an entry for a
// reason of their own, or restate a refusal).
absl::Status RefusedError(absl::string_view message);
// Whether `status` is a refusal (RefusedEntry, RefusedError), not an I/O error.
bool IsRefusal(const absl::Status& status);

struct DirectoryEntry {
  std::string name;
  EntryType type = EntryType::kOther;
};

// A descriptor owned: an open file (for reading, or created for writing) or nothing.
// Thread contract: fd() may be used from any number of threads at once (pread, fstat); moving,
// closing and destroying must not race them.
class File {
 public:
  File() = default;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // A regular file another process opened and passed to this one (SCM_RIGHTS), adopted:
  // ownership of `fd` is taken (closed on error). INVALID_ARGUMENT naming `path` (for messages
  // only: nothing is opened by it) when the descriptor is not a regular file open for reading.
  static absl::StatusOr<File> FromPassedDescriptor(int fd, std::string path);

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // The file's size now (fstat).
  absl::StatusOr<uint64_t> Size() const;
  // Closes the descriptor and returns close's error (NFS reports deferred write errors there).
  absl::Status Close();

 private:
  int fd_ = -1;
  std::string path_;
};

// A directory held open. Every operation names one entry of it (a single path component: not
// empty, ".", ".." or containing '/'; INVALID_ARGUMENT otherwise) and works relative to its
// descriptor with *at() calls and O_NOFOLLOW / AT_SYMLINK_NOFOLLOW: no link is ever followed, so
// nothing outside the directory is read, written or removed through one. An entry that is a
// link, or of another type than the operation expects (a directory, a regular file), is refused
// with RefusedEntry's FAILED_PRECONDITION naming its path. An entry that does not exist is
// NOT_FOUND; other failures are errno statuses naming the path.
//
// The root of the checkpoint volume is the only directory opened by path (OpenRoot): the operator
// chose it, so it is trusted and may itself be a link. Everything below it is reached from it one
// component at a time (OpenPath, CreatePath).
//
// Thread contract: the const methods may run on any number of threads at once (they only pass
// the descriptor to the kernel); moving, assigning and destroying must not race them.
class Directory {
 public:
  // Opens `path` (following links: it is trusted) as a directory. `hooks` (may be null) sees
  // every operation on it and on everything opened from it.
  static absl::StatusOr<Directory> OpenRoot(std::string path,
                                            std::shared_ptr<StorageHooks> hooks = nullptr);

  // A directory another process opened and passed to this one (SCM_RIGHTS), adopted as a root:
  // that process chose it, with its own permissions, and vouches for it; what is below it is
  // still reached without following links. Ownership of `fd` is taken (closed on error).
  // INVALID_ARGUMENT naming `path` (for messages only) when the descriptor is not a directory.
  static absl::StatusOr<Directory> FromPassedDescriptor(int fd, std::string path);

  ~Directory();
  Directory(Directory&& other) noexcept;
  Directory& operator=(Directory&& other) noexcept;
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // The directory's path as reached (root path, then the components walked), for messages.
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  const std::shared_ptr<StorageHooks>& hooks() const { return hooks_; }
  // "<path()>/<name>".
  std::string PathOf(absl::string_view name) const;
  // Calls the hooks' Before (OK without hooks). For layers that run system calls on descriptors
  // this class handed out (DurableFile's writes and fsyncs).
  absl::Status CallHooks(StorageOperation operation, const std::string& path) const;

  // The same directory on a descriptor of its own (dup), hooks included.
  absl::StatusOr<Directory> Duplicate() const;

  // The subdirectory `name`.
  absl::StatusOr<Directory> OpenChild(absl::string_view name) const;
  // The subdirectory `name`, created (mode 0777 less the umask, as mkdir -p) unless it exists.
  absl::StatusOr<Directory> CreateChild(absl::string_view name) const;
  // The directory `relative` names below this one ("team/job-000042"), opened one component at
  // a time with OpenChild; "" is this directory (Duplicate). INVALID_ARGUMENT for an absolute
  // path or a component that is not a name.
  absl::StatusOr<Directory> OpenPath(absl::string_view relative) const;
  // OpenPath, creating missing components with CreateChild.
  absl::StatusOr<Directory> CreatePath(absl::string_view relative) const;

  // The regular file `name`, opened for reading. Its type is checked before the open (a FIFO or
  // a device is never opened) and again on the open descriptor.
  absl::StatusOr<File> OpenFile(absl::string_view name) const;
  // A new regular file `name`, created for writing (mode 0644 less the umask) with O_EXCL:
  // ALREADY_EXISTS when any entry has that name (a link included, which is not followed).
  absl::StatusOr<File> CreateFile(absl::string_view name) const;

  // The entries, without "." and "..", sorted by name, each typed by lstat (an entry removed
  // meanwhile is left out).
  absl::StatusOr<std::vector<DirectoryEntry>> List() const;
  // lstat of `name`. NOT_FOUND when it does not exist.
  absl::StatusOr<struct stat> Stat(absl::string_view name) const;

  // Removes the entry `name`, which must not be a directory (a link is removed, never its
  // target).
  absl::Status Unlink(absl::string_view name) const;
  // Removes the empty subdirectory `name` (a link there fails: ENOTDIR).
  absl::Status RemoveDir(absl::string_view name) const;
  // Renames `from` to `to`, both entries of this directory (rename(2) follows neither; an entry
  // `to` that is a link is replaced, not written through).
  absl::Status Rename(absl::string_view from, absl::string_view to) const;
  // fsync of the directory, so that entries made or removed in it survive a crash.
  absl::Status Sync() const;

 private:
  Directory(int fd, std::string path, std::shared_ptr<StorageHooks> hooks)
      : fd_(fd), path_(std::move(path)), hooks_(std::move(hooks)) {}

  int fd_ = -1;  // owned; -1 once moved from
  std::string path_;
  std::shared_ptr<StorageHooks> hooks_;
};

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_DIRECTORY_H_
