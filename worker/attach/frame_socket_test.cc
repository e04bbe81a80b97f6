// FrameSocket over a socketpair: frames round-trip, a descriptor travels as SCM_RIGHTS, and a
// closed peer, an oversized frame and Shutdown() end a Read with the documented codes.
#include "worker/attach/frame_socket.h"

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

}  // namespace
}  // namespace zeroshard::attach
