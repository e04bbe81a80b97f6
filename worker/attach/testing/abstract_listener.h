// A listening unix socket in the abstract namespace for protocol tests: the worker side
// accepts on fd(), a test's trainer connects with Connect().
#ifndef ZEROSHARD_WORKER_ATTACH_TESTING_ABSTRACT_LISTENER_H_
#define ZEROSHARD_WORKER_ATTACH_TESTING_ABSTRACT_LISTENER_H_

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "worker/attach/frame_socket.h"

namespace zeroshard::attach::testing {

// No file, no path length to mind.
class Listener {
 public:
  explicit Listener(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    address_.sun_family = AF_UNIX;
    std::memcpy(address_.sun_path + 1, name.data(), name.size());
    length_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    bound_ =
        ::bind(fd_, reinterpret_cast<sockaddr*>(&address_), length_) == 0 && ::listen(fd_, 4) == 0;
  }
  ~Listener() { ::close(fd_); }
  bool bound() const { return bound_; }
  int fd() const { return fd_; }

  // A trainer's connection, or null; `fd_out` (if given) gets its descriptor, which the socket
  // owns.
  std::unique_ptr<FrameSocket> Connect(int* fd_out = nullptr) const {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&address_), length_) != 0) {
      ::close(fd);
      return nullptr;
    }
    if (fd_out != nullptr) *fd_out = fd;
    return std::make_unique<FrameSocket>(fd);
  }

 private:
  int fd_ = -1;
  sockaddr_un address_{};
  socklen_t length_ = 0;
  bool bound_ = false;
};

}  // namespace zeroshard::attach::testing

#endif  // ZEROSHARD_WORKER_ATTACH_TESTING_ABSTRACT_LISTENER_H_
