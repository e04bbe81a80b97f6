// FrameSocket over a socketpair: frames round-trip, a descriptor travels as SCM_RIGHTS, and a
// closed peer, an oversized frame and Shutdown() end a Read with the documented codes.
#include "worker/attach/frame_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "zeroshard/v1/attach.pb.h"

namespace zeroshard::attach {
namespace {

TEST(FrameSocketTest, FramesRoundTripAndCarryADescriptor) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameSocket worker(fds[0]);
  FrameSocket trainer(fds[1]);
  v1::AttachRequest request;
  request.mutable_segment()->set_tensor(3);
  request.mutable_segment()->set_end(1000);
  ASSERT_TRUE(trainer.Write(request).ok());
  v1::AttachRequest received;
  ASSERT_TRUE(worker.Read(received).ok());
  EXPECT_EQ(received.segment().tensor(), 3);
  EXPECT_EQ(received.segment().end(), 1000);

  // A pipe's write end sent with a response: the receiver writes through its copy.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  v1::AttachResponse response;
  response.mutable_mapped()->set_block(7);
  ASSERT_TRUE(worker.Write(response, pipe_fds[1]).ok());
  char header[4];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  iovec io{header, sizeof(header)};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ASSERT_EQ(recvmsg(fds[1], &message, 0), 4);
  cmsghdr* passed = CMSG_FIRSTHDR(&message);
  ASSERT_NE(passed, nullptr);
  ASSERT_EQ(passed->cmsg_type, SCM_RIGHTS);
  int received_fd = -1;
  std::memcpy(&received_fd, CMSG_DATA(passed), sizeof(int));
  EXPECT_NE(received_fd, pipe_fds[1]);
  ASSERT_EQ(write(received_fd, "x", 1), 1);
  char byte = 0;
  ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);
  EXPECT_EQ(byte, 'x');
  close(received_fd);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(FrameSocketTest, ClosedPeerOversizedFrameAndShutdownEndARead) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  {
    FrameSocket worker(fds[0]);
    const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};
    ASSERT_EQ(write(fds[1], huge, 4), 4);
    v1::AttachRequest request;
    EXPECT_TRUE(absl::IsInvalidArgument(worker.Read(request)));
    close(fds[1]);
    EXPECT_TRUE(absl::IsUnavailable(worker.Read(request)));
  }
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameSocket worker(fds[0]);
  absl::Status status;
  std::thread reader([&] {
    v1::AttachRequest request;
    status = worker.Read(request);
  });
  worker.Shutdown();
  reader.join();
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  close(fds[1]);
}

// Sends one frame holding `message` from `fd` with `count` copies of `pass_fd` (SCM_RIGHTS), in
// one sendmsg, as a trainer does.
void SendWithDescriptors(int fd, const v1::AttachRequest& message, int pass_fd, int count) {
  std::string frame(4, '\0');
  ASSERT_TRUE(message.AppendToString(&frame));
  const uint32_t length = static_cast<uint32_t>(frame.size() - 4);
  for (int k = 0; k < 4; ++k) frame[k] = static_cast<char>((length >> (8 * k)) & 0xff);
  iovec io{frame.data(), frame.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  std::memset(control, 0, sizeof(control));
  header.msg_control = control;
  header.msg_controllen = CMSG_SPACE(sizeof(int) * count);
  cmsghdr* rights = CMSG_FIRSTHDR(&header);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof(int) * count);
  for (int k = 0; k < count; ++k) {
    std::memcpy(CMSG_DATA(rights) + k * sizeof(int), &pass_fd, sizeof(int));
  }
  ASSERT_EQ(sendmsg(fd, &header, 0), static_cast<ssize_t>(frame.size()));
}

// Whether the pipe whose read end is `read_fd` still has a writer: false once every copy of its
// write end is closed (a read then sees end of file).
bool PipeHasWriter(int read_fd) {
  pollfd poll_fd{read_fd, POLLIN, 0};
  return poll(&poll_fd, 1, 0) == 0;
}

// A trainer passes the descriptor of what it opened with load_state: it reaches the reader. A
// descriptor the reader did not ask for is closed, and a frame with more than one is refused
// with every copy closed: a trainer cannot fill the worker's descriptor table.
TEST(FrameSocketTest, AReadTakesTheFramesDescriptorAndClosesWhatItDidNotAskFor) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameSocket worker(fds[0]);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  v1::AttachRequest request;
  request.mutable_load_state()->set_full_state_file("/tmp/x.safetensors");

  SendWithDescriptors(fds[1], request, pipe_fds[1], 1);
  v1::AttachRequest received;
  UniqueFd passed;
  ASSERT_TRUE(worker.Read(received, &passed).ok());
  EXPECT_EQ(received.load_state().full_state_file(), "/tmp/x.safetensors");
  ASSERT_TRUE(passed.valid());
  ASSERT_EQ(write(passed.get(), "y", 1), 1);
  char byte = 0;
  ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);
  EXPECT_EQ(byte, 'y');

  // A frame without one leaves `passed` empty.
  ASSERT_TRUE(FrameSocket(dup(fds[1])).Write(request).ok());
  ASSERT_TRUE(worker.Read(received, &passed).ok());
  EXPECT_FALSE(passed.valid());

  // Unasked for, and three at once: closed.
  SendWithDescriptors(fds[1], request, pipe_fds[1], 1);
  ASSERT_TRUE(worker.Read(received).ok());
  SendWithDescriptors(fds[1], request, pipe_fds[1], 3);
  const absl::Status three = worker.Read(received, &passed);
  EXPECT_TRUE(absl::IsInvalidArgument(three)) << three;
  EXPECT_FALSE(passed.valid());
  close(pipe_fds[1]);
  EXPECT_FALSE(PipeHasWriter(pipe_fds[0]));
  close(pipe_fds[0]);
  close(fds[1]);
}

// Issue 36, row 4: the accept loop reads hellos without blocking (ReadAvailable did not exist:
// this test fails to compile before the fix). A frame that arrives a byte at a time is
// assembled across calls; a frame over the caller's cap, or one carrying a descriptor, is
// refused (the caller then drops the connection); a closed peer is UNAVAILABLE.
TEST(FrameSocketTest, ReadAvailableAssemblesAFrameAcrossCallsWithoutBlocking) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameSocket worker(fds[0]);
  v1::AttachRequest hello;
  hello.mutable_hello()->set_job_id("job-000001");
  std::string frame(4, '\0');
  ASSERT_TRUE(hello.AppendToString(&frame));
  frame[0] = static_cast<char>(frame.size() - 4);
  v1::AttachRequest received;
  absl::StatusOr<bool> whole = worker.ReadAvailable(received, 1024);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(*whole);  // nothing yet: no wait
  EXPECT_FALSE(worker.frame_started());
  for (size_t k = 0; k < frame.size(); ++k) {
    ASSERT_EQ(write(fds[1], &frame[k], 1), 1);
    whole = worker.ReadAvailable(received, 1024);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(*whole, k + 1 == frame.size());
    EXPECT_EQ(worker.frame_started(), k + 1 < frame.size());
  }
  EXPECT_EQ(received.hello().job_id(), "job-000001");

  const unsigned char over[4] = {0x01, 0x04, 0, 0};  // 1025 bytes
  ASSERT_EQ(write(fds[1], over, 4), 4);
  const absl::Status oversized = worker.ReadAvailable(received, 1024).status();
  EXPECT_TRUE(absl::IsInvalidArgument(oversized)) << oversized;
  close(fds[1]);

  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameSocket with_fd(fds[0]);
  SendWithDescriptors(fds[1], hello, fds[1], 1);
  const absl::Status carried = with_fd.ReadAvailable(received, 1024).status();
  EXPECT_TRUE(absl::IsInvalidArgument(carried)) << carried;
  close(fds[1]);

  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameSocket hung_up(fds[0]);
  close(fds[1]);
  const absl::Status closed = hung_up.ReadAvailable(received, 1024).status();
  EXPECT_TRUE(absl::IsUnavailable(closed)) << closed;
}

}  // namespace
}  // namespace zeroshard::attach
