// POSIX file helpers for checkpoints. Every system call's failure becomes a Status naming the
// path and the errno text.
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

absl::Status ErrnoError(absl::string_view operation, absl::string_view path, int error_number) {
  return absl::ErrnoToStatus(error_number, absl::StrCat(operation, " ", path));
}

std::string DirectoryOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

absl::Status SyncDirectory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", directory, errno);
  absl::Status status;
  if (::fsync(fd) != 0) status = ErrnoError("fsync directory", directory, errno);
  ::close(fd);
  return status;
}

absl::StatusOr<std::unique_ptr<DurableFile>> DurableFile::Create(std::string final_path) {
  if (BaseNameOf(final_path).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("file path \"", final_path, "\" has no name"));
  }
  const std::string directory = DirectoryOf(final_path);
  absl::BitGen random;
  for (int attempt = 1;; ++attempt) {
    std::string temp_path =
        absl::StrFormat("%s/.%s.tmp-%d-%016x", directory, BaseNameOf(final_path), ::getpid(),
                        absl::Uniform<uint64_t>(random));
    const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      return std::unique_ptr<DurableFile>(
          new DurableFile(std::move(final_path), std::move(temp_path), fd));
    }
    if (errno != EEXIST || attempt == kTempNameAttempts) {
      return ErrnoError("create", temp_path, errno);
    }
  }
}

DurableFile::DurableFile(std::string final_path, std::string temp_path, int fd)
    : final_path_(std::move(final_path)), temp_path_(std::move(temp_path)), fd_(fd) {}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

absl::Status DurableFile::Fail(absl::Status status) {
  if (error_.ok()) error_ = status;
  return status;
}

absl::Status DurableFile::WriteFully(const char* data, size_t n) {
  while (n > 0) {
    const ssize_t written = ::write(fd_, data, n);
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
  const char* bytes = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, n, static_cast<off_t>(offset));
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
  if (::fsync(fd_) != 0) return Fail(ErrnoError("fsync", temp_path_, errno));
  const int fd = std::exchange(fd_, -1);
  // close can report a deferred write error (NFS): the data is not known to be on disk.
  if (::close(fd) != 0) return Fail(ErrnoError("close", temp_path_, errno));
  if (before_rename_hook_) before_rename_hook_();
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return Fail(ErrnoError(absl::StrCat("rename to ", final_path_, " of"), temp_path_, errno));
  }
  absl::Status synced = SyncDirectory(DirectoryOf(final_path_));
  if (!synced.ok()) {
    // The rename may not survive a crash: take it back, so that an error always means no file.
    ::unlink(final_path_.c_str());
    return Fail(synced);
  }
  committed_ = true;
  return absl::OkStatus();
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

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  std::string contents;
  char chunk[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, chunk, sizeof(chunk));
    if (got < 0) {
      if (errno == EINTR) continue;
      absl::Status status = ErrnoError("read", path, errno);
      ::close(fd);
      return status;
    }
    if (got == 0) break;
    contents.append(chunk, static_cast<size_t>(got));
  }
  ::close(fd);
  return contents;
}

}  // namespace zeroshard::checkpoint
