// FrameSocket: the attach protocol's framing (proto/zeroshard/v1/attach.proto) on a connected
// unix stream socket: a 4-byte little-endian length, then one serialized message; a frame may
// carry one file descriptor (SCM_RIGHTS).
#ifndef ZEROSHARD_WORKER_ATTACH_FRAME_SOCKET_H_
#define ZEROSHARD_WORKER_ATTACH_FRAME_SOCKET_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "google/protobuf/message_lite.h"

namespace zeroshard::attach {

// Frames longer than this are refused (a trainer's welcome lists every tensor: 64 MiB allows
// hundreds of thousands).
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// Thread contract: one thread reads and writes; Shutdown() may be called from any thread.
class FrameSocket {
 public:
  // Takes ownership of `fd`, a connected unix stream socket.
  explicit FrameSocket(int fd);
  ~FrameSocket();
  FrameSocket(const FrameSocket&) = delete;
  FrameSocket& operator=(const FrameSocket&) = delete;

  // Blocks for the next frame. UNAVAILABLE when the peer closed the connection (between frames
  // or inside one), CANCELLED after Shutdown(), INVALID_ARGUMENT for an oversized or unparsable
  // frame, or one that carried more than one descriptor (all are closed). The descriptor a
  // frame carried goes to `passed_fd` (left empty when none came); without `passed_fd` it is
  // closed, so a peer cannot fill this process's descriptor table.
  absl::Status Read(google::protobuf::MessageLite& message, UniqueFd* passed_fd = nullptr);
  // Never blocks: takes what has arrived of the next frame, which may be at most `max_bytes`
  // long. OK(true) once the whole frame has come and parsed into `message`; OK(false) when more
  // must come (call again once the socket is readable). Errors as Read's; a frame that carries a
  // descriptor is INVALID_ARGUMENT (the descriptors are closed). frame_started() says whether
  // part of a frame is held. Do not mix with Read() inside one frame.
  absl::StatusOr<bool> ReadAvailable(google::protobuf::MessageLite& message, uint32_t max_bytes);
  bool frame_started() const { return !partial_.empty(); }
  // Sends one frame, with `pass_fd` as SCM_RIGHTS when >= 0 (the descriptor stays open here).
  absl::Status Write(const google::protobuf::MessageLite& message, int pass_fd = -1);
  // Ends a blocked Read (CANCELLED) and every later call.
  void Shutdown();

 private:
  // Reads `size` bytes; descriptors that come with them are appended to `passed` (a truncated
  // control message, more than fit, is INVALID_ARGUMENT).
  absl::Status ReadExactly(char* data, size_t size, bool frame_started,
                           std::vector<UniqueFd>& passed);

  const int fd_;
  std::atomic<bool> shut_down_{false};
  // ReadAvailable's bytes of the frame under way: its length, then its body.
  std::string partial_;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_FRAME_SOCKET_H_
