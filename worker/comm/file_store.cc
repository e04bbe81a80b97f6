// FileStore: atomic-rename writes, polled reads, flock-guarded counters. Every syscall error
// becomes a Status here.
#include "worker/comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace zeroshard::comm {
namespace {

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// NOT_FOUND when the file does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return ErrnoStatus("open", path);
  }
  std::string contents;
  char chunk[4096];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = ErrnoStatus("read", path);
      ::close(fd);
      return status;
    }
    if (n == 0) break;
    contents.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return contents;
}

// Holds an exclusive flock on a file for its lifetime.
class FileLock {
 public:
  static absl::StatusOr<FileLock> Acquire(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("open", path);
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        absl::Status status = ErrnoStatus("flock", path);
        ::close(fd);
        return status;
      }
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {}

std::string FileStore::PathOf(absl::string_view key) const {
  std::string name = "k_";
  for (char c : key) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
    if (plain) {
      name.push_back(c);
    } else {
      absl::StrAppendFormat(&name, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileStore::WriteAtomically(const std::string& path, absl::string_view value) {
  const std::string temporary =
      absl::StrCat(directory_, "/.tmp.", ::getpid(), ".", next_temporary_.fetch_add(1));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("open", temporary);
  size_t written = 0;
  while (written < value.size()) {
    const ssize_t n = ::write(fd, value.data() + written, value.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = ErrnoStatus("write", temporary);
      ::close(fd);
      ::unlink(temporary.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return ErrnoStatus("close", temporary);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoStatus("rename", temporary);
    ::unlink(temporary.c_str());
    return status;
  }
  return absl::OkStatus();
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  return WriteAtomically(PathOf(key), value);
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Duration timeout) {
  const std::string path = PathOf(key);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration poll = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<std::string> value = ReadFile(path);
    if (value.ok() || !absl::IsNotFound(value.status())) return value;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' not set within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(poll, deadline - now));
    poll = std::min(poll * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  ZS_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(absl::StrCat(directory_, "/.lock")));
  const std::string path = PathOf(key);
  int64_t value = 0;
  absl::StatusOr<std::string> current = ReadFile(path);
  if (current.ok()) {
    if (!absl::SimpleAtoi(*current, &value)) {
      return absl::FailedPreconditionError(
          absl::StrCat("store key '", key, "' does not hold a counter"));
    }
  } else if (!absl::IsNotFound(current.status())) {
    return current.status();
  }
  value += delta;
  ZS_RETURN_IF_ERROR(WriteAtomically(path, absl::StrCat(value)));
  return value;
}

absl::StatusOr<bool> FileStore::Delete(absl::string_view key) {
  const std::string path = PathOf(key);
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoStatus("unlink", path);
}

}  // namespace zeroshard::comm
