// AttachListener: the worker's listening unix socket for attached trainers (docs/pytorch.md).
#ifndef ZEROSHARD_WORKER_ATTACH_ATTACH_LISTENER_H_
#define ZEROSHARD_WORKER_ATTACH_ATTACH_LISTENER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace zeroshard::attach {

// Thread contract: immutable after Create; runs accept on fd() from their own thread, one at a
// time.
class AttachListener {
 public:
  // Listens on `path` (absolute, at most 107 bytes), replacing a stale socket left there by a
  // worker that died; INVALID_ARGUMENT for a bad path or one that exists and is not a socket,
  // UNAVAILABLE when the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<AttachListener>> Create(const std::string& path);
  // Closes the socket and removes its path.
  ~AttachListener();
  AttachListener(const AttachListener&) = delete;
  AttachListener& operator=(const AttachListener&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  AttachListener(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  const int fd_;
  const std::string path_;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_ATTACH_LISTENER_H_
