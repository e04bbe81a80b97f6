// AttachedTrainer::Accept against real unix sockets: a trainer that said hello and hung up before
// any generation accepted it (a launcher's earlier attempt) is skipped, not welcomed.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/attach/attach_listener.h"
#include "worker/attach/attached_trainer.h"
#include "worker/attach/frame_socket.h"
#include "worker/attach/shared_memory_backing.h"
#include "zeroshard/v1/attach.pb.h"

namespace zeroshard::attach {
namespace {

constexpr char kJobId[] = "job-000007";

class AttachedTrainerAcceptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char directory[] = "/tmp/zs-accept-XXXXXX";
    ASSERT_NE(::mkdtemp(directory), nullptr);
    directory_ = directory;
    absl::StatusOr<std::unique_ptr<AttachListener>> listener =
        AttachListener::Create(directory_ + "/worker.sock");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
  }

  void TearDown() override {
    listener_.reset();
    ::rmdir(directory_.c_str());
  }

  // A trainer's connection that has said hello as rank 0 of 1 of kJobId.
  std::unique_ptr<FrameSocket> ConnectAndSayHello() {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, listener_->path().c_str(), listener_->path().size());
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
        << std::strerror(errno);
    // The test's bound on waiting for the worker's side: no read here may hang.
    timeval timeout{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    auto connection = std::make_unique<FrameSocket>(fd);
    v1::AttachRequest hello;
    hello.mutable_hello()->set_job_id(kJobId);
    hello.mutable_hello()->set_rank(0);
    hello.mutable_hello()->set_world_size(1);
    EXPECT_TRUE(connection->Write(hello).ok());
    return connection;
  }

  AttachedTrainerOptions Options(absl::Duration attach_within) const {
    AttachedTrainerOptions options;
    options.listen_fd = listener_->fd();
    options.job_id = kJobId;
    options.generation = 2;
    options.rank = 0;
    options.world_size = 1;
    options.attach_deadline = absl::Now() + attach_within;
    return options;
  }

  std::string directory_;
  std::unique_ptr<AttachListener> listener_;
  SharedMemoryBacking backing_;
};

TEST_F(AttachedTrainerAcceptTest, SkipsATrainerThatHungUpAfterItsHello) {
  ConnectAndSayHello().reset();  // closes it: the hello stays in the backlog
  AttachedTrainer trainer(Options(absl::Milliseconds(300)), &backing_);
  const absl::Status accepted = trainer.Accept();
  EXPECT_TRUE(absl::IsDeadlineExceeded(accepted)) << accepted;
}

TEST_F(AttachedTrainerAcceptTest, AcceptsTheLiveTrainerQueuedBehindADeadOne) {
  ConnectAndSayHello().reset();
  std::unique_ptr<FrameSocket> live = ConnectAndSayHello();
  AttachedTrainer trainer(Options(absl::Seconds(30)), &backing_);
  ASSERT_TRUE(trainer.Accept().ok());
  // Abort() shuts the accepted connection down: the live trainer reads its end (had the dead
  // one been accepted, the live one would still wait in the backlog and its read time out).
  trainer.Abort();
  // (A timeout is UNAVAILABLE too, with another message: "broke", not "closed".)
  v1::AttachResponse response;
  const absl::Status read = live->Read(response);
  EXPECT_TRUE(absl::IsUnavailable(read)) << read;
  EXPECT_NE(read.message().find("closed its connection"), std::string::npos) << read;
}

TEST_F(AttachedTrainerAcceptTest, RefusesATrainerOfAnotherRank) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, listener_->path().c_str(), listener_->path().size());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  FrameSocket wrong_rank(fd);
  v1::AttachRequest hello;
  hello.mutable_hello()->set_job_id(kJobId);
  hello.mutable_hello()->set_rank(1);
  hello.mutable_hello()->set_world_size(1);
  ASSERT_TRUE(wrong_rank.Write(hello).ok());
  AttachedTrainer trainer(Options(absl::Seconds(30)), &backing_);
  const absl::Status accepted = trainer.Accept();
  EXPECT_TRUE(absl::IsFailedPrecondition(accepted)) << accepted;
  v1::AttachResponse refusal;
  ASSERT_TRUE(wrong_rank.Read(refusal).ok());
  EXPECT_NE(refusal.error().find("rank 1 of 1"), std::string::npos) << refusal.error();
}

}  // namespace
}  // namespace zeroshard::attach
