// The worker daemon's identity file. Every syscall error becomes a Status here.
#include "worker/daemon/identity_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace zeroshard::worker {
namespace {

constexpr char kIdPrefix[] = "worker_id=";
constexpr char kSecretPrefix[] = "secret=";
// An identity is two short lines; anything longer is not one.
constexpr size_t kMaxBytes = 4096;

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int error = errno;
  return absl::Status(error == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInternal,
                      absl::StrCat("identity_file: ", what, " ", path, ": ", std::strerror(error)));
}

// Closes the descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::optional<WorkerIdentity>> ReadIdentityFile(const std::string& path) {
  // No link followed: whoever may write the directory must not point the daemon elsewhere.
  Fd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::nullopt;
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat("identity_file: ", path, " is a symbolic link; it must be a plain file"));
    }
    return Errno("cannot open", path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("identity_file: ", path, " is not a regular file"));
  }
  // It holds a secret: only this user may read or change it.
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("identity_file: ", path, " must belong to this user (uid ", geteuid(),
                     ") and have mode 0600; it is uid ", st.st_uid, ", mode 0",
                     (st.st_mode & 0777) / 64, (st.st_mode & 077) / 8, st.st_mode & 07));
  }
  std::string text(kMaxBytes + 1, '\0');
  size_t size = 0;
  while (size < text.size()) {
    const ssize_t n = read(fd.get(), text.data() + size, text.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  text.resize(size);
  WorkerIdentity identity;
  bool has_id = false, has_secret = false;
  if (size <= kMaxBytes) {
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      if (absl::ConsumePrefix(&line, kIdPrefix)) {
        identity.worker_id = std::string(line);
        has_id = !line.empty();
      } else if (absl::ConsumePrefix(&line, kSecretPrefix)) {
        identity.secret = std::string(line);
        has_secret = !line.empty();
      }
    }
  }
  if (!has_id || !has_secret) {
    return absl::FailedPreconditionError(absl::StrCat(
        "identity_file: ", path,
        " is not a worker identity (a worker_id= and a secret= line); remove it to start "
        "afresh"));
  }
  return identity;
}

absl::Status WriteIdentityFile(const std::string& path, const WorkerIdentity& identity) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  // A temporary left by a daemon killed while writing goes first (never followed if a link).
  if (unlink(temporary.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove", temporary);
  {
    Fd fd(open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0) return Errno("cannot create", temporary);
    const std::string text =
        absl::StrCat(kIdPrefix, identity.worker_id, "\n", kSecretPrefix, identity.secret, "\n");
    size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = write(fd.get(), text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno("cannot write", temporary);
      written += static_cast<size_t>(n);
    }
    if (fsync(fd.get()) != 0) return Errno("cannot fsync", temporary);
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) return Errno("cannot rename onto", path);
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  Fd dir(open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return Errno("cannot open the directory of", path);
  if (fsync(dir.get()) != 0) return Errno("cannot fsync the directory of", path);
  return absl::OkStatus();
}

}  // namespace zeroshard::worker
