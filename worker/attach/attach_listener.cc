// AttachListener: bind a unix socket path, restrict who may connect, listen.
#include "worker/attach/attach_listener.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zeroshard::attach {
namespace {

// The gid of `group` (a name or a number).
absl::StatusOr<gid_t> ResolveGroup(const std::string& group) {
  uint32_t number = 0;
  if (absl::SimpleAtoi(group, &number)) return static_cast<gid_t>(number);
  for (size_t size = 16384; size <= (size_t{1} << 22); size *= 4) {
    std::vector<char> buffer(size);
    struct group entry;
    struct group* found = nullptr;
    const int error = ::getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (error == ERANGE) continue;
    if (error == 0 && found != nullptr) return found->gr_gid;
    return absl::InvalidArgumentError(
        absl::StrCat("attach_group: no group '", group, "'",
                     error != 0 ? absl::StrCat(" (", std::strerror(error), ")") : ""));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("attach_group: group '", group, "' has too large an entry"));
}

absl::StatusOr<std::vector<gid_t>> PeerGroups(int fd) {
  // SO_PEERGROUPS (Linux 4.13): the supplementary groups the peer had when it connected, taken
  // by the kernel with its credentials. Not /proc/<pid>/status (the pid may have exited and been
  // reused since) nor getgrouplist(uid) (the group database's view, not the process's: a process
  // that dropped a group, or a uid with no passwd entry, would be judged by the wrong list).
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t length = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &length) == 0) {
      groups.resize(length / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) {
      return absl::PermissionDeniedError(
          absl::StrCat("the attach socket cannot tell the peer's groups (SO_PEERGROUPS): ",
                       std::strerror(errno)));
    }
    groups.resize(length / sizeof(gid_t) + 1);  // the kernel said how many it has
  }
  return absl::PermissionDeniedError("the peer's group list kept growing (SO_PEERGROUPS)");
}

}  // namespace

absl::Status AttachPeerPolicy::Check(int fd) const {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("the attach socket cannot tell who connected: ", std::strerror(errno)));
  }
  if (peer.uid == uid || (group.has_value() && peer.gid == *group)) return absl::OkStatus();
  // A member of --attach_group whose primary group is another: what the kernel checked the
  // socket file's group permission against at connect (the process's own supplementary groups).
  std::string groups_seen;
  if (group.has_value()) {
    absl::StatusOr<std::vector<gid_t>> groups = PeerGroups(fd);
    if (!groups.ok()) return groups.status();
    if (std::find(groups->begin(), groups->end(), *group) != groups->end()) {
      return absl::OkStatus();
    }
    groups_seen = absl::StrCat(", supplementary groups [", absl::StrJoin(*groups, ","), "]");
  }
  return absl::PermissionDeniedError(
      absl::StrCat("process ", peer.pid, " (uid ", peer.uid, ", gid ", peer.gid, groups_seen,
                   ") may not attach: only uid ", uid,
                   group.has_value() ? absl::StrCat(" or members of group ", *group)
                                     : std::string(" (the worker's user)"),
                   " may; --attach_group lets a group's processes attach"));
}

absl::StatusOr<std::unique_ptr<AttachListener>> AttachListener::Create(const std::string& path,
                                                                       const std::string& group) {
  sockaddr_un address{};
  if (path.empty() || path[0] != '/' || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("attach_socket: '", path,
                                                   "' is not an absolute path of at most ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  AttachPeerPolicy peers;
  if (!group.empty()) {
    absl::StatusOr<gid_t> gid = ResolveGroup(group);
    if (!gid.ok()) return gid.status();
    peers.group = *gid;
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
  auto fail = [&](const std::string& what) -> absl::Status {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("attach_socket: ", what, " '", path, "': ", why));
  };
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("attach_socket: binding '", path, "': ", why));
  }
  // The mode before listen(): until then every connect is refused, so no one slips in while the
  // file still has the umask's mode.
  if (peers.group.has_value()) {
    if (::chown(path.c_str(), static_cast<uid_t>(-1), *peers.group) != 0) {
      return fail(absl::StrCat("giving group ", *peers.group, " (--attach_group)"));
    }
    if (::chmod(path.c_str(), 0660) != 0) return fail("setting mode 0660 on");
  } else if (::chmod(path.c_str(), 0600) != 0) {
    return fail("setting mode 0600 on");
  }
  if (::listen(fd, 64) != 0) return fail("listening on");
  return std::unique_ptr<AttachListener>(new AttachListener(fd, path, peers));
}

AttachListener::~AttachListener() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

}  // namespace zeroshard::attach
