// Test support: a plain-socket HTTP/1.1 client for an HttpServer port, plus the raw
// connections that tests hold open idle or feed one byte at a time.
#ifndef ZEROSHARD_HTTP_HTTP_TEST_CLIENT_H_
#define ZEROSHARD_HTTP_HTTP_TEST_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zeroshard::http::testing {

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
};

// A connected TCP socket to 127.0.0.1:port, closed on destruction.
// Thread contract: one thread at a time.
class RawConnection {
 public:
  static absl::StatusOr<RawConnection> Open(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    RawConnection connection(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
    }
    return connection;
  }

  RawConnection(RawConnection&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RawConnection& operator=(RawConnection&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  ~RawConnection() {
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Send(absl::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t sent = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
      }
      bytes.remove_prefix(static_cast<size_t>(sent));
    }
    return absl::OkStatus();
  }

  // Everything the peer sends until it closes; DEADLINE_EXCEEDED if it is still open then.
  absl::StatusOr<std::string> ReadUntilClosed(absl::Time deadline) {
    std::string received;
    char buffer[4096];
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat("peer still open after sending ", received.size(), " bytes"));
      }
      pollfd readable{fd_, POLLIN, 0};
      const int ready = poll(
          &readable, 1, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
      if (ready < 0 && errno != EINTR) {
        return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
      }
      if (ready <= 0) continue;
      const ssize_t got = recv(fd_, buffer, sizeof(buffer), 0);
      if (got == 0) return received;
      if (got < 0) {
        if (errno == EINTR) continue;
        // A reset after the reply (the server closing with unread bytes) still ends the reply.
        if (errno == ECONNRESET) return received;
        return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
      }
      received.append(buffer, static_cast<size_t>(got));
    }
  }

 private:
  explicit RawConnection(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// "HTTP/1.1 200 OK\r\nContent-Type: ...\r\n\r\nbody" -> its status, content type and body.
inline absl::StatusOr<HttpReply> ParseReply(absl::string_view raw) {
  const size_t end_of_headers = raw.find("\r\n\r\n");
  if (end_of_headers == absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat("no end of headers in '", raw, "'"));
  }
  const std::vector<absl::string_view> lines =
      absl::StrSplit(raw.substr(0, end_of_headers), "\r\n");
  const std::vector<absl::string_view> status_line = absl::StrSplit(lines[0], ' ');
  HttpReply reply;
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &reply.status)) {
    return absl::DataLossError(absl::StrCat("bad status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(lines[i].substr(0, colon), "content-type")) {
      reply.content_type = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  reply.body = std::string(raw.substr(end_of_headers + 4));
  return reply;
}

// Sends `request` (whole, as written: its own Host header, or none) on a fresh connection and
// reads the answer until the server closes it, by `deadline`.
inline absl::StatusOr<HttpReply> Exchange(int port, absl::string_view request,
                                          absl::Time deadline) {
  absl::StatusOr<RawConnection> connection = RawConnection::Open(port);
  if (!connection.ok()) return connection.status();
  absl::Status sent = connection->Send(request);
  if (!sent.ok()) return sent;
  absl::StatusOr<std::string> raw = connection->ReadUntilClosed(deadline);
  if (!raw.ok()) return raw.status();
  return ParseReply(*raw);
}

// One request on a fresh connection ("Connection: close"), answered by `deadline`.
inline absl::StatusOr<HttpReply> Request(int port, absl::string_view method, absl::string_view path,
                                         absl::Time deadline) {
  return Exchange(
      port,
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
      deadline);
}

inline absl::StatusOr<HttpReply> Get(int port, absl::string_view path, absl::Time deadline) {
  return Request(port, "GET", path, deadline);
}

// Slow clients: connections that each send one byte of a GET request every 1-2 s (a different
// period each, first bytes staggered over the first second), from one thread, never finishing
// the request within a test. Thread contract: Open and destroy on one thread; the accessors and
// WaitForBytes from any.
class SlowClients {
 public:
  static absl::StatusOr<std::unique_ptr<SlowClients>> Open(int port, int count) {
    std::unique_ptr<SlowClients> clients(new SlowClients());
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<RawConnection> connection = RawConnection::Open(port);
      if (!connection.ok()) return connection.status();
      clients->connections_.push_back(std::move(*connection));
    }
    clients->thread_ = std::thread([raw = clients.get()] { raw->Run(); });
    return clients;
  }

  ~SlowClients() {
    stop_.Notify();
    thread_.join();
  }

  int64_t bytes_sent() const {
    absl::MutexLock lock(&mutex_);
    return bytes_sent_;
  }
  int64_t send_errors() const {
    absl::MutexLock lock(&mutex_);
    return send_errors_;
  }

  // Whether `bytes` bytes in all have been sent by `deadline`.
  bool WaitForBytes(int64_t bytes, absl::Time deadline) const {
    absl::MutexLock lock(&mutex_);
    auto enough = [this, bytes]()
                      ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return bytes_sent_ >= bytes; };
    return mutex_.AwaitWithDeadline(absl::Condition(&enough), deadline);
  }

 private:
  SlowClients() = default;

  void Run() {
    // Longer than any test: the server must never see a complete request from these.
    const std::string request =
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: zeroshard-slow-test-client\r\n"
        "Accept: */*\r\n\r\n";
    const int count = static_cast<int>(connections_.size());
    std::vector<absl::Time> next_send(connections_.size());
    std::vector<absl::Duration> period(connections_.size());
    std::vector<size_t> offset(connections_.size(), 0);
    const absl::Time start = absl::Now();
    for (int i = 0; i < count; ++i) {
      next_send[i] = start + absl::Seconds(1) * i / count;
      period[i] = absl::Seconds(1) + absl::Seconds(1) * i / count;
    }
    while (count > 0) {
      const int due = static_cast<int>(std::min_element(next_send.begin(), next_send.end()) -
                                       next_send.begin());
      // Pacing, not waiting for state: the stop notification ends the wait early.
      if (stop_.WaitForNotificationWithTimeout(next_send[due] - absl::Now())) return;
      const absl::Status sent =
          connections_[due].Send(absl::string_view(&request[offset[due] % request.size()], 1));
      ++offset[due];
      next_send[due] += period[due];
      absl::MutexLock lock(&mutex_);
      if (sent.ok()) {
        ++bytes_sent_;
      } else {
        ++send_errors_;
      }
    }
    stop_.WaitForNotification();
  }

  std::vector<RawConnection> connections_;
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex mutex_;
  int64_t bytes_sent_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t send_errors_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace zeroshard::http::testing

#endif  // ZEROSHARD_HTTP_HTTP_TEST_CLIENT_H_
