// AttachListener: bind and listen on a unix socket path.
#include "worker/attach/attach_listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zeroshard::attach {

absl::StatusOr<std::unique_ptr<AttachListener>> AttachListener::Create(const std::string& path) {
  sockaddr_un address{};
  if (path.empty() || path[0] != '/' || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("attach_socket: '", path,
                                                   "' is not an absolute path of at most ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  struct stat existing;
  if (::lstat(path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("attach_socket: '", path, "' exists and is not a socket"));
    }
    ::unlink(path.c_str());  // a socket left by a worker that died
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("attach_socket: listening on '", path, "': ", why));
  }
  return std::unique_ptr<AttachListener>(new AttachListener(fd, path));
}

AttachListener::~AttachListener() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

}  // namespace zeroshard::attach
