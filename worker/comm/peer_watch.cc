// PeerWatch: listener, publication, connections in rank order, and the watch thread.
#include "worker/comm/peer_watch.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace zeroshard::comm {
namespace {

// Every blocking wait of Connect is cut into slices this long, so an abort is seen in time.
constexpr absl::Duration kPollSlice = absl::Milliseconds(50);
// What a rank that stops watching tells its peers (PeerWatch::Parting).
constexpr char kFarewell = 'F';
constexpr char kLeaving = 'L';

// Closes the descriptor unless released.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~OwnedFd() { Reset(); }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

absl::Status ErrnoError(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("peer watch: ", what, ": ", std::strerror(errno)));
}

std::string WatchKey(const PeerWatchOptions& options, int rank) {
  return absl::StrCat(options.store_prefix, "/watch/", rank);
}

// Returns once `fd` has one of `events`, or CANCELLED / DEADLINE_EXCEEDED.
absl::Status AwaitFd(int fd, short events, const PeerWatchOptions& options,
                     absl::string_view waiting_for) {
  while (true) {
    if (options.abort_signal != nullptr && options.abort_signal->aborted()) {
      return absl::CancelledError("peer watch: aborted");
    }
    const absl::Duration remaining = options.deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("peer watch: ", waiting_for, " did not happen by the rendezvous deadline"));
    }
    pollfd descriptor{fd, events, 0};
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(std::min(remaining, kPollSlice))));
    const int ready = ::poll(&descriptor, 1, timeout_ms);
    if (ready < 0 && errno != EINTR) return ErrnoError("poll");
    if (ready > 0) return absl::OkStatus();
  }
}

// Keepalive probes after 10 s of silence, every 2 s, 3 of them: a peer whose host vanished
// (no FIN, no RST) is noticed after about 16 s.
absl::Status EnableKeepalive(int fd) {
  const int on = 1, idle_s = 10, interval_s = 2, probes = 3;
  if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s)) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s)) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes)) != 0) {
    return ErrnoError("setsockopt keepalive");
  }
  return absl::OkStatus();
}

absl::StatusOr<addrinfo*> Resolve(const std::string& host, const char* port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* result = nullptr;
  const int error = ::getaddrinfo(host.c_str(), port, &hints, &result);
  if (error != 0 || result == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("peer watch: cannot resolve '", host, "': ", ::gai_strerror(error)));
  }
  return result;
}

// A listening socket on `hostname` (any port) and what to publish for it.
absl::StatusOr<OwnedFd> Listen(const std::string& hostname, int backlog, std::string* published) {
  ZS_ASSIGN_OR_RETURN(addrinfo * address, Resolve(hostname, "0", AI_NUMERICSERV));
  absl::Cleanup free_address = [address] { ::freeaddrinfo(address); };
  OwnedFd listener(::socket(address->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (listener.get() < 0) return ErrnoError("socket");
  if (::bind(listener.get(), address->ai_addr, address->ai_addrlen) != 0) {
    return ErrnoError(absl::StrCat("bind to ", hostname));
  }
  if (::listen(listener.get(), backlog) != 0) return ErrnoError("listen");
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    return ErrnoError("getsockname");
  }
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  const int error = ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), length, host, sizeof(host),
                                  port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("peer watch: getnameinfo: ", ::gai_strerror(error)));
  }
  *published = absl::StrCat(host, " ", port);
  return listener;
}

// Polls the store in short slices until `peer` has published its listener.
absl::StatusOr<std::string> AwaitPublished(const PeerWatchOptions& options, int peer) {
  while (true) {
    if (options.abort_signal != nullptr && options.abort_signal->aborted()) {
      return absl::CancelledError("peer watch: aborted");
    }
    const absl::Duration remaining = options.deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "peer watch: rank ", peer, " did not publish its address by the rendezvous deadline"));
    }
    absl::StatusOr<std::string> value =
        options.store->Get(WatchKey(options, peer), std::min(remaining, kPollSlice));
    if (value.ok()) return value;
    if (!absl::IsDeadlineExceeded(value.status())) {
      return absl::UnavailableError(absl::StrCat("peer watch: reading rank ", peer,
                                                 "'s address: ", value.status().ToString()));
    }
  }
}

// Connects to `peer`'s listener and tells it this rank.
absl::StatusOr<OwnedFd> ConnectToPeer(const PeerWatchOptions& options, int peer) {
  ZS_ASSIGN_OR_RETURN(const std::string published, AwaitPublished(options, peer));
  const std::vector<std::string> parts = absl::StrSplit(published, ' ');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer watch: rank ", peer, " published '", published, "', not 'host port'"));
  }
  ZS_ASSIGN_OR_RETURN(addrinfo * address,
                      Resolve(parts[0], parts[1].c_str(), AI_NUMERICHOST | AI_NUMERICSERV));
  absl::Cleanup free_address = [address] { ::freeaddrinfo(address); };
  OwnedFd fd(::socket(address->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return ErrnoError("socket");
  if (::connect(fd.get(), address->ai_addr, address->ai_addrlen) != 0 && errno != EINPROGRESS) {
    return ErrnoError(absl::StrCat("connecting to rank ", peer, " at ", published));
  }
  ZS_RETURN_IF_ERROR(
      AwaitFd(fd.get(), POLLOUT, options, absl::StrCat("connecting to rank ", peer)));
  int error = 0;
  socklen_t length = sizeof(error);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
    return ErrnoError("getsockopt SO_ERROR");
  }
  if (error != 0) {
    errno = error;
    return ErrnoError(absl::StrCat("connecting to rank ", peer, " at ", published));
  }
  ZS_RETURN_IF_ERROR(EnableKeepalive(fd.get()));
  const uint32_t rank = static_cast<uint32_t>(options.rank);
  // Four bytes into a fresh connection's empty send buffer: written whole at once.
  if (::send(fd.get(), &rank, sizeof(rank), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(rank))) {
    return ErrnoError(absl::StrCat("telling rank ", peer, " this rank"));
  }
  return fd;
}

// Accepts one connection from a rank above this one and reads which rank it is.
absl::StatusOr<std::pair<int, OwnedFd>> AcceptPeer(const PeerWatchOptions& options, int listener) {
  ZS_RETURN_IF_ERROR(AwaitFd(listener, POLLIN, options, "the connections of the higher ranks"));
  OwnedFd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (fd.get() < 0) return ErrnoError("accept");
  uint32_t rank = 0;
  size_t received = 0;
  while (received < sizeof(rank)) {
    ZS_RETURN_IF_ERROR(AwaitFd(fd.get(), POLLIN, options, "a connected peer's rank"));
    const ssize_t n = ::recv(fd.get(), reinterpret_cast<char*>(&rank) + received,
                             sizeof(rank) - received, MSG_DONTWAIT);
    if (n == 0) return absl::UnavailableError("peer watch: a peer closed before saying its rank");
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return ErrnoError("reading a peer's rank");
    }
    received += static_cast<size_t>(n);
  }
  if (rank <= static_cast<uint32_t>(options.rank) ||
      rank >= static_cast<uint32_t>(options.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("peer watch: a peer says it is rank ", rank,
                                                   "; rank ", options.rank, " of ",
                                                   options.world_size, " expects higher ranks"));
  }
  ZS_RETURN_IF_ERROR(EnableKeepalive(fd.get()));
  return std::make_pair(static_cast<int>(rank), std::move(fd));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerWatch>> PeerWatch::Connect(const PeerWatchOptions& options) {
  if (options.world_size < 2 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("peer watch: needs rank < world_size >= 2, got ",
                                                   options.rank, " of ", options.world_size));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("peer watch: needs a store");
  std::string published;
  ZS_ASSIGN_OR_RETURN(OwnedFd listener, Listen(options.hostname, options.world_size, &published));
  if (absl::Status set = options.store->Set(WatchKey(options, options.rank), published);
      !set.ok()) {
    return absl::UnavailableError(
        absl::StrCat("peer watch: publishing this rank's address: ", set.ToString()));
  }
  std::vector<OwnedFd> by_rank(options.world_size);
  for (int peer = 0; peer < options.rank; ++peer) {
    ZS_ASSIGN_OR_RETURN(by_rank[peer], ConnectToPeer(options, peer));
  }
  for (int accepted = options.rank + 1; accepted < options.world_size; ++accepted) {
    ZS_ASSIGN_OR_RETURN(auto peer, AcceptPeer(options, listener.get()));
    if (by_rank[peer.first].get() >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer watch: rank ", peer.first, " connected twice"));
    }
    by_rank[peer.first] = std::move(peer.second);
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) return ErrnoError("pipe");
  std::vector<Peer> peers;
  for (int rank = 0; rank < options.world_size; ++rank) {
    if (rank != options.rank) peers.push_back(Peer{rank, by_rank[rank].Release(), false});
  }
  return std::unique_ptr<PeerWatch>(
      new PeerWatch(options.rank, std::move(peers), wake[0], wake[1]));
}

PeerWatch::PeerWatch(int rank, std::vector<Peer> peers, int wake_read, int wake_write)
    : rank_(rank), peers_(std::move(peers)), wake_read_(wake_read), wake_write_(wake_write) {}

PeerWatch::~PeerWatch() {
  Stop(Parting::kLeaving);
  ::close(wake_read_);
  ::close(wake_write_);
}

void PeerWatch::Start(PeerLost on_lost) {
  thread_ = std::thread([this, on_lost = std::move(on_lost)] { WatchLoop(on_lost); });
}

void PeerWatch::WatchLoop(PeerLost on_lost) {
  bool reported = false;
  std::vector<pollfd> descriptors;
  std::vector<Peer*> watched;
  while (true) {
    descriptors.assign(1, pollfd{wake_read_, POLLIN, 0});
    watched.clear();
    for (Peer& peer : peers_) {
      if (peer.fd < 0) continue;
      descriptors.push_back(pollfd{peer.fd, POLLIN, 0});
      watched.push_back(&peer);
    }
    if (::poll(descriptors.data(), descriptors.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;  // cannot happen with valid descriptors; the collectives' timeouts remain
    }
    if (descriptors[0].revents != 0) return;
    for (size_t i = 0; i < watched.size(); ++i) {
      if (descriptors[i + 1].revents == 0) continue;
      Peer& peer = *watched[i];
      const std::optional<std::string> how = ReadUntilEnd(peer);
      if (!how.has_value() || peer.said_farewell || reported) continue;
      reported = true;
      on_lost(absl::UnavailableError(
          peer.said_leaving
              ? absl::StrCat("rank ", rank_, ": peer rank ", peer.rank,
                             " left the group (its communicator failed or was aborted) and ", *how)
              : absl::StrCat("rank ", rank_, " lost peer rank ", peer.rank, ": it ", *how,
                             " without a word (its process ended)")));
    }
  }
}

std::optional<std::string> PeerWatch::ReadUntilEnd(Peer& peer) {
  char bytes[64];
  ssize_t n;
  while ((n = ::recv(peer.fd, bytes, sizeof(bytes), MSG_DONTWAIT)) > 0) {
    const absl::string_view said(bytes, static_cast<size_t>(n));
    if (absl::StrContains(said, kFarewell)) peer.said_farewell = true;
    if (absl::StrContains(said, kLeaving)) peer.said_leaving = true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::nullopt;
  std::string how = n == 0 ? std::string("closed its connection")
                           : absl::StrCat("broke its connection (", std::strerror(errno), ")");
  ::close(peer.fd);
  peer.fd = -1;
  absl::MutexLock lock(&mu_);
  if (peer.said_farewell) {
    ++ended_.with_farewell;
  } else if (peer.said_leaving) {
    ++ended_.leaving;
  } else {
    ++ended_.lost;
    lost_ranks_.push_back(peer.rank);
  }
  return how;
}

void PeerWatch::Stop(Parting parting) {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const char wake = 1;
    while (::write(wake_write_, &wake, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    // Also drains what the peer said: unread bytes would turn close into a reset, and the peer
    // might then lose this rank's parting word.
    if (ReadUntilEnd(peer).has_value()) continue;
    if (parting != Parting::kSilent) {
      const char word = parting == Parting::kFarewell ? kFarewell : kLeaving;
      ::send(peer.fd, &word, 1, MSG_NOSIGNAL);
    }
    ::close(peer.fd);
    peer.fd = -1;
  }
}

PeerWatch::Ended PeerWatch::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

std::vector<int> PeerWatch::lost_ranks() const {
  absl::MutexLock lock(&mu_);
  return lost_ranks_;
}

}  // namespace zeroshard::comm
