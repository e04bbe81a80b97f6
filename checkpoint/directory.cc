// Directories and files of the checkpoint volume reached through descriptors: openat, mkdirat,
// fstatat, unlinkat and renameat with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW, each failure a Status
// naming the path.
#include "checkpoint/directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"

namespace zeroshard::checkpoint {
namespace {

// Marks the refusals of this layer (IsRefusal).
constexpr absl::string_view kRefusalPayload = "type.zeroshard.dev/checkpoint.RefusedEntry";

absl::string_view ExpectedName(EntryType type) {
  switch (type) {
    case EntryType::kDirectory:
      return "a directory";
    case EntryType::kRegularFile:
      return "a regular file";
    case EntryType::kSymlink:
      return "a symbolic link";
    case EntryType::kOther:
      break;
  }
  return "something else";
}

// INVALID_ARGUMENT naming `path` unless `fd`, a descriptor another process passed, is open and
// of `expected` type (a directory or a regular file).
absl::Status CheckPassedDescriptor(int fd, const std::string& path, EntryType expected) {
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the descriptor passed for it is not open"));
  }
  const bool is_expected =
      expected == EntryType::kDirectory ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
  if (!is_expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the descriptor passed for it is not ", ExpectedName(expected)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ErrnoError(absl::string_view operation, absl::string_view path, int error_number) {
  return absl::ErrnoToStatus(error_number, absl::StrCat(operation, " ", path));
}

absl::string_view StorageOperationName(StorageOperation operation) {
  switch (operation) {
    case StorageOperation::kOpen:
      return "open";
    case StorageOperation::kList:
      return "list";
    case StorageOperation::kStat:
      return "stat";
    case StorageOperation::kMakeDirectory:
      return "mkdir";
    case StorageOperation::kCreate:
      return "create";
    case StorageOperation::kWrite:
      return "write";
    case StorageOperation::kSync:
      return "fsync";
    case StorageOperation::kRename:
      return "rename";
    case StorageOperation::kUnlink:
      return "unlink";
    case StorageOperation::kRemoveDirectory:
      return "rmdir";
  }
  return "?";
}

EntryType EntryTypeOf(mode_t mode) {
  if (S_ISDIR(mode)) return EntryType::kDirectory;
  if (S_ISREG(mode)) return EntryType::kRegularFile;
  if (S_ISLNK(mode)) return EntryType::kSymlink;
  return EntryType::kOther;
}

std::string DescribeFileType(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a file of unknown type";
}

absl::Status RefusedEntry(absl::string_view path, mode_t mode, EntryType expected) {
  return RefusedError(absl::StrCat(
      path, " is ", DescribeFileType(mode), ", where ", ExpectedName(expected),
      " is expected: refused", S_ISLNK(mode) ? " (checkpoint storage never follows links)" : ""));
}

absl::Status RefusedError(absl::string_view message) {
  absl::Status status = absl::FailedPreconditionError(message);
  status.SetPayload(kRefusalPayload, absl::Cord("refused"));
  return status;
}

bool IsRefusal(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) && status.GetPayload(kRefusalPayload).has_value();
}

// ---- File ----

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

absl::StatusOr<File> File::FromPassedDescriptor(int fd, std::string path) {
  UniqueFd closer(fd);
  ZS_RETURN_IF_ERROR(CheckPassedDescriptor(fd, path, EntryType::kRegularFile));
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the descriptor passed for it is not open for reading"));
  }
  return File(closer.Release(), std::move(path));
}

absl::StatusOr<uint64_t> File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoError("fstat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status File::Close() {
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0) return ErrnoError("close", path_, errno);
  return absl::OkStatus();
}

// ---- Directory ----

namespace {

absl::Status CheckName(const std::string& directory, absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, '/') ||
      absl::StrContains(name, '\0')) {
    return absl::InvalidArgumentError(absl::StrCat("\"", absl::CHexEscape(name), "\" in ",
                                                   directory, " is not a single path component"));
  }
  return absl::OkStatus();
}

// Why opening `name` of `dir_fd` as `expected` failed with `error`: the refusal when the entry
// is of another type (a link, with O_NOFOLLOW), else the errno status.
absl::Status OpenFailure(int dir_fd, const std::string& name, const std::string& path,
                         EntryType expected, absl::string_view operation, int error) {
  struct stat st;
  if ((error == ELOOP || error == ENOTDIR || error == ENXIO || error == EISDIR) &&
      ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      EntryTypeOf(st.st_mode) != expected) {
    return RefusedEntry(path, st.st_mode, expected);
  }
  return ErrnoError(operation, path, error);
}

}  // namespace

absl::StatusOr<Directory> Directory::OpenRoot(std::string path,
                                              std::shared_ptr<StorageHooks> hooks) {
  if (path.empty()) return absl::InvalidArgumentError("checkpoint root: empty path");
  if (hooks != nullptr) ZS_RETURN_IF_ERROR(hooks->Before(StorageOperation::kOpen, path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", path, errno);
  return Directory(fd, std::move(path), std::move(hooks));
}

absl::StatusOr<Directory> Directory::FromPassedDescriptor(int fd, std::string path) {
  UniqueFd closer(fd);
  ZS_RETURN_IF_ERROR(CheckPassedDescriptor(fd, path, EntryType::kDirectory));
  // An O_PATH descriptor needs no read permission on the directory: adopting one would let the
  // worker read, with its own rights, a directory the trainer could not list (issue 36).
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_PATH) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": the descriptor passed for it is not open for reading (an O_PATH descriptor is "
        "refused: open the step directory with O_RDONLY | O_DIRECTORY)"));
  }
  return Directory(closer.Release(), std::move(path), nullptr);
}

Directory::~Directory() {
  if (fd_ >= 0) ::close(fd_);
}

Directory::Directory(Directory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      hooks_(std::move(other.hooks_)) {}

Directory& Directory::operator=(Directory&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    hooks_ = std::move(other.hooks_);
  }
  return *this;
}

std::string Directory::PathOf(absl::string_view name) const {
  if (absl::EndsWith(path_, "/")) return absl::StrCat(path_, name);
  return absl::StrCat(path_, "/", name);
}

absl::Status Directory::CallHooks(StorageOperation operation, const std::string& path) const {
  if (hooks_ == nullptr) return absl::OkStatus();
  return hooks_->Before(operation, path);
}

absl::StatusOr<Directory> Directory::Duplicate() const {
  const int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("dup descriptor of directory", path_, errno);
  return Directory(fd, path_, hooks_);
}

absl::StatusOr<Directory> Directory::OpenChild(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  std::string path = PathOf(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kOpen, path));
  const int fd = ::openat(fd_, entry.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return OpenFailure(fd_, entry, path, EntryType::kDirectory, "open directory", errno);
  }
  return Directory(fd, std::move(path), hooks_);
}

absl::StatusOr<Directory> Directory::CreateChild(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kMakeDirectory, PathOf(name)));
  // 0777 less the umask, as mkdir -p: ranks of other users share the volume where it allows.
  if (::mkdirat(fd_, entry.c_str(), 0777) != 0 && errno != EEXIST) {
    return ErrnoError("mkdir", PathOf(name), errno);
  }
  // An existing entry (made by another rank, or planted) is checked by the no-follow open.
  return OpenChild(name);
}

absl::StatusOr<Directory> Directory::OpenPath(absl::string_view relative) const {
  if (relative.empty()) return Duplicate();
  if (relative.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(relative), "\" under ", path_, " is absolute"));
  }
  std::vector<absl::string_view> components = absl::StrSplit(relative, '/');
  ZS_ASSIGN_OR_RETURN(Directory current, OpenChild(components.front()));
  for (size_t i = 1; i < components.size(); ++i) {
    ZS_ASSIGN_OR_RETURN(current, current.OpenChild(components[i]));
  }
  return current;
}

absl::StatusOr<Directory> Directory::CreatePath(absl::string_view relative) const {
  if (relative.empty()) return Duplicate();
  if (relative.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(relative), "\" under ", path_, " is absolute"));
  }
  std::vector<absl::string_view> components = absl::StrSplit(relative, '/');
  ZS_ASSIGN_OR_RETURN(Directory current, CreateChild(components.front()));
  for (size_t i = 1; i < components.size(); ++i) {
    ZS_ASSIGN_OR_RETURN(current, current.CreateChild(components[i]));
  }
  return current;
}

absl::StatusOr<File> Directory::OpenFile(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  std::string path = PathOf(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kOpen, path));
  // The type first, so that a FIFO (which would block) or a device is never opened.
  struct stat st;
  if (::fstatat(fd_, entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoError("open", path, errno);
  }
  if (!S_ISREG(st.st_mode)) return RefusedEntry(path, st.st_mode, EntryType::kRegularFile);
  // O_NONBLOCK: should the entry have become a FIFO since, the open does not wait for a writer.
  const int fd =
      ::openat(fd_, entry.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return OpenFailure(fd_, entry, path, EntryType::kRegularFile, "open", errno);
  UniqueFd closer(fd);
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) return RefusedEntry(path, st.st_mode, EntryType::kRegularFile);
  return File(closer.Release(), std::move(path));
}

absl::StatusOr<File> Directory::CreateFile(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  std::string path = PathOf(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kCreate, path));
  const int fd =
      ::openat(fd_, entry.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create", path, errno);
  return File(fd, std::move(path));
}

absl::StatusOr<std::vector<DirectoryEntry>> Directory::List() const {
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kList, path_));
  // A descriptor of its own: a dup would share the read position with concurrent listings.
  const int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", path_, errno);
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int error = errno;
    ::close(fd);
    return ErrnoError("open directory", path_, error);
  }
  std::vector<DirectoryEntry> entries;
  absl::Status status;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno != 0) status = ErrnoError("read directory", path_, errno);
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(fd_, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed since the read
      status = ErrnoError("stat", PathOf(name), errno);
      break;
    }
    entries.push_back({std::string(name), EntryTypeOf(st.st_mode)});
  }
  ::closedir(dir);
  ZS_RETURN_IF_ERROR(status);
  std::sort(entries.begin(), entries.end(),
            [](const DirectoryEntry& a, const DirectoryEntry& b) { return a.name < b.name; });
  return entries;
}

absl::StatusOr<struct stat> Directory::Stat(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  const std::string path = PathOf(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kStat, path));
  struct stat st;
  if (::fstatat(fd_, entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoError("stat", path, errno);
  }
  return st;
}

absl::Status Directory::Unlink(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  const std::string path = PathOf(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kUnlink, path));
  if (::unlinkat(fd_, entry.c_str(), 0) != 0) return ErrnoError("unlink", path, errno);
  return absl::OkStatus();
}

absl::Status Directory::RemoveDir(absl::string_view name) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, name));
  const std::string entry(name);
  const std::string path = PathOf(name);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kRemoveDirectory, path));
  if (::unlinkat(fd_, entry.c_str(), AT_REMOVEDIR) != 0) return ErrnoError("rmdir", path, errno);
  return absl::OkStatus();
}

absl::Status Directory::Rename(absl::string_view from, absl::string_view to) const {
  ZS_RETURN_IF_ERROR(CheckName(path_, from));
  ZS_RETURN_IF_ERROR(CheckName(path_, to));
  const std::string from_entry(from);
  const std::string to_entry(to);
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kRename, PathOf(to)));
  if (::renameat(fd_, from_entry.c_str(), fd_, to_entry.c_str()) != 0) {
    return ErrnoError(absl::StrCat("rename to ", PathOf(to), " of"), PathOf(from), errno);
  }
  return absl::OkStatus();
}

absl::Status Directory::Sync() const {
  ZS_RETURN_IF_ERROR(CallHooks(StorageOperation::kSync, path_));
  if (::fsync(fd_) != 0) return ErrnoError("fsync directory", path_, errno);
  return absl::OkStatus();
}

}  // namespace zeroshard::checkpoint
