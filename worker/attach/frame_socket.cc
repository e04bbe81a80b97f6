// FrameSocket: length-prefixed frames with an optional SCM_RIGHTS descriptor.
#include "worker/attach/frame_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zeroshard::attach {

FrameSocket::FrameSocket(int fd) : fd_(fd) {}

FrameSocket::~FrameSocket() { ::close(fd_); }

void FrameSocket::Shutdown() {
  shut_down_.store(true);
  ::shutdown(fd_, SHUT_RDWR);
}

namespace {

// Room for a few descriptors, so that a frame carrying more than one is seen (and refused) rather
// than silently truncated.
constexpr int kMaxReceivedFds = 4;

}  // namespace

absl::Status FrameSocket::ReadExactly(char* data, size_t size, bool frame_started,
                                      std::vector<UniqueFd>& passed) {
  size_t done = 0;
  while (done < size) {
    iovec io{data + done, size - done};
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxReceivedFds)];
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &header, MSG_CMSG_CLOEXEC);
    const int error = errno;
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t k = 0; k < count; ++k) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
          passed.emplace_back(fd);
        }
      }
    }
    if (shut_down_.load()) return absl::CancelledError("the attach connection was shut down");
    if (n > 0) {
      if ((header.msg_flags & MSG_CTRUNC) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("an attach frame carried more than ", kMaxReceivedFds, " descriptors"));
      }
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && error == EINTR) continue;
    if (n == 0 && done == 0 && !frame_started) {
      return absl::UnavailableError("the trainer closed its connection");
    }
    return absl::UnavailableError(
        absl::StrCat("the trainer's connection broke: ",
                     n == 0 ? "end of stream inside a frame" : std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::Read(google::protobuf::MessageLite& message, UniqueFd* passed_fd) {
  if (passed_fd != nullptr) passed_fd->Reset();
  std::vector<UniqueFd> passed;
  unsigned char header[4];
  if (absl::Status read = ReadExactly(reinterpret_cast<char*>(header), 4, false, passed);
      !read.ok()) {
    return read;
  }
  const uint32_t length = uint32_t{header[0]} | uint32_t{header[1]} << 8 |
                          uint32_t{header[2]} << 16 | uint32_t{header[3]} << 24;
  if (length > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach frame of ", length, " bytes (at most ", kMaxFrameBytes, ")"));
  }
  std::string body(length, '\0');
  if (absl::Status read = ReadExactly(body.data(), length, true, passed); !read.ok()) return read;
  if (passed.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an attach frame carried ", passed.size(), " descriptors (at most one)"));
  }
  if (!message.ParseFromString(body)) {
    return absl::InvalidArgumentError(absl::StrCat("unparsable attach frame (", length, " bytes)"));
  }
  if (passed_fd != nullptr && !passed.empty()) *passed_fd = std::move(passed.front());
  return absl::OkStatus();
}

absl::StatusOr<bool> FrameSocket::ReadAvailable(google::protobuf::MessageLite& message,
                                                uint32_t max_bytes) {
  while (true) {
    // How many bytes the frame still needs: its 4-byte length first, then its body.
    size_t wanted = 4;
    if (partial_.size() >= 4) {
      const auto* header = reinterpret_cast<const unsigned char*>(partial_.data());
      const uint32_t length = uint32_t{header[0]} | uint32_t{header[1]} << 8 |
                              uint32_t{header[2]} << 16 | uint32_t{header[3]} << 24;
      if (length > max_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("attach frame of ", length, " bytes (at most ", max_bytes, " here)"));
      }
      wanted = 4 + size_t{length};
    }
    if (partial_.size() == wanted && wanted > 4) {
      const bool parsed = message.ParseFromArray(partial_.data() + 4, wanted - 4);
      partial_.clear();
      if (!parsed) {
        return absl::InvalidArgumentError(
            absl::StrCat("unparsable attach frame (", wanted - 4, " bytes)"));
      }
      return true;
    }
    if (partial_.size() == wanted) {  // an empty message: the 4-byte length 0
      partial_.clear();
      message.Clear();
      return true;
    }
    const size_t have = partial_.size();
    partial_.resize(wanted);
    iovec io{partial_.data() + have, wanted - have};
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxReceivedFds)];
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &header, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    const int error = errno;
    partial_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      bool carried_fd = (header.msg_flags & MSG_CTRUNC) != 0;
      for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t k = 0; k < count; ++k) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
          UniqueFd closer(fd);
          carried_fd = true;
        }
      }
      if (carried_fd) {
        return absl::InvalidArgumentError("this attach frame may not carry a descriptor");
      }
    }
    if (shut_down_.load()) return absl::CancelledError("the attach connection was shut down");
    if (n > 0) continue;
    if (n < 0 && error == EINTR) continue;
    if (n < 0 && (error == EAGAIN || error == EWOULDBLOCK)) return false;
    if (n == 0 && have == 0) return absl::UnavailableError("the trainer closed its connection");
    return absl::UnavailableError(
        absl::StrCat("the trainer's connection broke: ",
                     n == 0 ? "end of stream inside a frame" : std::strerror(error)));
  }
}

absl::Status FrameSocket::Write(const google::protobuf::MessageLite& message, int pass_fd) {
  if (shut_down_.load()) return absl::CancelledError("the attach connection was shut down");
  std::string frame(4, '\0');
  if (!message.AppendToString(&frame)) return absl::InternalError("cannot serialize a frame");
  const uint32_t length = static_cast<uint32_t>(frame.size() - 4);
  for (int k = 0; k < 4; ++k) frame[k] = static_cast<char>((length >> (8 * k)) & 0xff);
  size_t sent = 0;
  bool fd_sent = pass_fd < 0;
  while (sent < frame.size()) {
    iovec io{frame.data() + sent, frame.size() - sent};
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      std::memset(control, 0, sizeof(control));
      header.msg_control = control;
      header.msg_controllen = sizeof(control);
      cmsghdr* message_header = CMSG_FIRSTHDR(&header);
      message_header->cmsg_level = SOL_SOCKET;
      message_header->cmsg_type = SCM_RIGHTS;
      message_header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(message_header), &pass_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(fd_, &header, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("writing to the trainer failed: ", std::strerror(errno)));
    }
    fd_sent = true;
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::attach
