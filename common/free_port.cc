#include "common/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::common {

absl::StatusOr<int> PickFreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind/getsockname: ", std::strerror(error)));
  }
  close(fd);
  return ntohs(address.sin_port);
}

int PickFreeLoopbackPortOrDie() {
  absl::StatusOr<int> port = PickFreeLoopbackPort();
  if (!port.ok()) {
    std::fprintf(stderr, "PickFreeLoopbackPort: %s\n", port.status().ToString().c_str());
    std::abort();
  }
  return *port;
}

}  // namespace zeroshard::common
