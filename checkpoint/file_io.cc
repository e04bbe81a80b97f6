// File helpers for checkpoints on directory descriptors. Every system call's failure becomes a
// Status naming the path and the errno text.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

// Large enough that per-call overhead vanishes against the disk, small enough to be noise next
// to a shard.
constexpr size_t kBufferBytes = size_t{1} << 20;

// Temporary names must not collide across hosts on a shared filesystem, where containers often
// run with the same pid: a random part, and O_EXCL so that a collision is retried, not shared.
constexpr int kTempNameAttempts = 8;

absl::string_view BaseNameOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string DirectoryOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

absl::StatusOr<std::unique_ptr<DurableFile>> DurableFile::Create(const Directory& directory,
                                                                 std::string name) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("file path \"", directory.PathOf(""), "\" has no name"));
  }
  ZS_ASSIGN_OR_RETURN(Directory own, directory.Duplicate());
  absl::BitGen random;
  for (int attempt = 1;; ++attempt) {
    std::string temp_name =
        absl::StrFormat(".%s.tmp-%d-%016x", name, ::getpid(), absl::Uniform<uint64_t>(random));
    absl::StatusOr<File> file = own.CreateFile(temp_name);
    if (file.ok()) {
      return std::unique_ptr<DurableFile>(
          new DurableFile(std::move(own), std::move(name), std::move(temp_name), *std::move(file)));
    }
    if (!absl::IsAlreadyExists(file.status()) || attempt == kTempNameAttempts) {
      return file.status();
    }
  }
}

absl::StatusOr<std::unique_ptr<DurableFile>> DurableFile::Create(std::string final_path) {
  const absl::string_view name = BaseNameOf(final_path);
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("file path \"", final_path, "\" has no name"));
  }
  ZS_ASSIGN_OR_RETURN(const Directory directory, Directory::OpenRoot(DirectoryOf(final_path)));
  return Create(directory, std::string(name));
}

DurableFile::DurableFile(Directory directory, std::string name, std::string temp_name, File file)
    : directory_(std::move(directory)),
      name_(std::move(name)),
      temp_name_(std::move(temp_name)),
      final_path_(directory_.PathOf(name_)),
      temp_path_(directory_.PathOf(temp_name_)),
      file_(std::move(file)) {}

DurableFile::~DurableFile() {
  file_.Close().IgnoreError();
  if (!committed_) directory_.Unlink(temp_name_).IgnoreError();
}

absl::Status DurableFile::Fail(absl::Status status) {
  if (error_.ok()) error_ = status;
  return status;
}

absl::Status DurableFile::WriteFully(const char* data, size_t n) {
  if (absl::Status hooked = directory_.CallHooks(StorageOperation::kWrite, temp_path_);
      !hooked.ok()) {
    return Fail(hooked);
  }
  while (n > 0) {
    const ssize_t written = ::write(file_.fd(), data, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      return Fail(ErrnoError("write", temp_path_, errno));
    }
    data += written;
    n -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status DurableFile::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(WriteFully(buffer_.data(), buffer_.size()));
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status DurableFile::Append(const void* data, size_t n) {
  ZS_RETURN_IF_ERROR(error_);
  if (committed_) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": committed"));
  const char* bytes = static_cast<const char*>(data);
  if (buffer_.size() + n <= kBufferBytes) {
    buffer_.insert(buffer_.end(), bytes, bytes + n);
  } else {
    ZS_RETURN_IF_ERROR(Flush());
    if (n >= kBufferBytes) {
      ZS_RETURN_IF_ERROR(WriteFully(bytes, n));
    } else {
      buffer_.insert(buffer_.end(), bytes, bytes + n);
    }
  }
  size_ += n;
  return absl::OkStatus();
}

absl::Status DurableFile::OverwriteAt(uint64_t offset, const void* data, size_t n) {
  ZS_RETURN_IF_ERROR(error_);
  if (committed_) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": committed"));
  if (offset > size_ || n > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("overwrite of bytes [", offset, ", ", offset + n,
                                              ") of ", temp_path_, ", which holds ", size_));
  }
  ZS_RETURN_IF_ERROR(Flush());
  if (absl::Status hooked = directory_.CallHooks(StorageOperation::kWrite, temp_path_);
      !hooked.ok()) {
    return Fail(hooked);
  }
  const char* bytes = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t written = ::pwrite(file_.fd(), bytes, n, static_cast<off_t>(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      return Fail(ErrnoError("pwrite", temp_path_, errno));
    }
    bytes += written;
    offset += static_cast<uint64_t>(written);
    n -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status DurableFile::Commit() {
  ZS_RETURN_IF_ERROR(error_);
  if (committed_) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": committed"));
  ZS_RETURN_IF_ERROR(Flush());
  if (absl::Status hooked = directory_.CallHooks(StorageOperation::kSync, temp_path_);
      !hooked.ok()) {
    return Fail(hooked);
  }
  if (::fsync(file_.fd()) != 0) return Fail(ErrnoError("fsync", temp_path_, errno));
  // close can report a deferred write error (NFS): the data is not known to be on disk.
  if (absl::Status closed = file_.Close(); !closed.ok()) return Fail(closed);
  if (before_rename_hook_) before_rename_hook_();
  // Whatever was planted under the final name is refused rather than replaced unseen.
  const absl::StatusOr<struct stat> existing = directory_.Stat(name_);
  if (existing.ok() && !S_ISREG(existing->st_mode)) {
    return Fail(RefusedEntry(final_path_, existing->st_mode, EntryType::kRegularFile));
  }
  if (!existing.ok() && !absl::IsNotFound(existing.status())) return Fail(existing.status());
  if (absl::Status renamed = directory_.Rename(temp_name_, name_); !renamed.ok()) {
    return Fail(renamed);
  }
  if (absl::Status synced = directory_.Sync(); !synced.ok()) {
    // The rename may not survive a crash: take it back, so that an error always means no file.
    directory_.Unlink(name_).IgnoreError();
    return Fail(synced);
  }
  committed_ = true;
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const Directory& directory, std::string name,
                              absl::string_view contents,
                              std::function<void()> before_rename_for_testing) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<DurableFile> file,
                      DurableFile::Create(directory, std::move(name)));
  file->SetBeforeRenameHookForTesting(std::move(before_rename_for_testing));
  ZS_RETURN_IF_ERROR(file->Append(contents.data(), contents.size()));
  return file->Commit();
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents,
                              std::function<void()> before_rename_for_testing) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<DurableFile> file, DurableFile::Create(path));
  file->SetBeforeRenameHookForTesting(std::move(before_rename_for_testing));
  ZS_RETURN_IF_ERROR(file->Append(contents.data(), contents.size()));
  return file->Commit();
}

absl::Status PreadFully(int fd, const std::string& path, uint64_t offset, void* out, size_t n) {
  char* bytes = static_cast<char*>(out);
  const uint64_t begin = offset;
  while (n > 0) {
    const ssize_t got = ::pread(fd, bytes, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("pread", path, errno);
    }
    if (got == 0) {
      return absl::OutOfRangeError(absl::StrCat("read of bytes [", begin, ", ", offset + n, ") of ",
                                                path, ": the file ends at ", offset));
    }
    bytes += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileToString(const File& file, uint64_t max_bytes) {
  ZS_ASSIGN_OR_RETURN(const uint64_t size, file.Size());
  auto too_large = [&](uint64_t bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(file.path(), " holds ", bytes,
                                                     " bytes, more than the ", max_bytes,
                                                     " this reader accepts"));
  };
  if (size > max_bytes) return too_large(size);
  std::string contents;
  contents.reserve(static_cast<size_t>(size));
  char chunk[1 << 16];
  uint64_t offset = 0;
  while (true) {
    const ssize_t got = ::pread(file.fd(), chunk, sizeof(chunk), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read", file.path(), errno);
    }
    if (got == 0) break;
    offset += static_cast<uint64_t>(got);
    if (offset > max_bytes) return too_large(offset);  // it grew while being read
    contents.append(chunk, static_cast<size_t>(got));
  }
  return contents;
}

absl::StatusOr<std::string> ReadFileToString(const Directory& directory, absl::string_view name,
                                             uint64_t max_bytes) {
  ZS_ASSIGN_OR_RETURN(const File file, directory.OpenFile(name));
  return ReadFileToString(file, max_bytes);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  const absl::string_view name = BaseNameOf(path);
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("file path \"", path, "\" has no name"));
  }
  ZS_ASSIGN_OR_RETURN(const Directory directory, Directory::OpenRoot(DirectoryOf(path)));
  return ReadFileToString(directory, name, max_bytes);
}

}  // namespace zeroshard::checkpoint
