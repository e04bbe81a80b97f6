// AttachListener: the worker's listening unix socket for attached trainers (docs/pytorch.md),
// and who may connect to it.
#ifndef ZEROSHARD_WORKER_ATTACH_ATTACH_LISTENER_H_
#define ZEROSHARD_WORKER_ATTACH_ATTACH_LISTENER_H_

#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard::attach {

// Who may attach: processes running as the daemon's user, and, with --attach_group, processes
// in that group: as their primary group (SO_PEERCRED's gid) or a supplementary one
// (SO_PEERGROUPS), the groups the kernel checked the socket file's mode against. A trainer attached
// to a worker reads and writes its engine's memory and drives its runs, so nobody else may.
struct AttachPeerPolicy {
  uid_t uid = ::geteuid();  // the daemon's

  std::optional<gid_t> group;

  // OK for an allowed peer of connected unix socket `fd`; PERMISSION_DENIED naming the peer's
  // uid, gid and pid and what is allowed (and the --attach_group flag) otherwise.
  absl::Status Check(int fd) const;
};

// Thread contract: immutable after Create; runs accept on fd() from their own thread, one at a
// time.
class AttachListener {
 public:
  // Listens on `path` (absolute, at most 107 bytes), replacing a stale socket left there by a
  // worker that died. The socket file is mode 0600, or 0660 owned by `group` (a group name or
  // number, --attach_group) when given, set before it listens. INVALID_ARGUMENT for a bad path,
  // one that exists and is not a socket, or an unknown group; UNAVAILABLE when the socket
  // cannot be made.
  static absl::StatusOr<std::unique_ptr<AttachListener>> Create(const std::string& path,
                                                                const std::string& group = "");
  // Closes the socket and removes its path.
  ~AttachListener();
  AttachListener(const AttachListener&) = delete;
  AttachListener& operator=(const AttachListener&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  const AttachPeerPolicy& peers() const { return peers_; }

 private:
  AttachListener(int fd, std::string path, AttachPeerPolicy peers)
      : fd_(fd), path_(std::move(path)), peers_(peers) {}
  const int fd_;
  const std::string path_;
  const AttachPeerPolicy peers_;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_ATTACH_LISTENER_H_
