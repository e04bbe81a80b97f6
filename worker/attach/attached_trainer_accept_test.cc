// AttachedTrainer::Accept against real unix sockets: a trainer that said hello and hung up before
// any generation accepted it (a launcher's earlier attempt) is skipped, not welcomed; a wrong
// hello or a silent connection costs only that connection; only the worker's user (or group)
// may attach.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

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
    std::filesystem::remove_all(directory_);
  }

  // A connection to the worker's socket that has sent nothing yet.
  std::unique_ptr<FrameSocket> Connect() {
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
    return std::make_unique<FrameSocket>(fd);
  }

  // A trainer's connection that has said hello as rank 0 of 1 of kJobId.
  std::unique_ptr<FrameSocket> ConnectAndSayHello() {
    std::unique_ptr<FrameSocket> connection = Connect();
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

// Issue 25, item 3: a hello with the right job id (viewers can read it) but another rank failed
// the whole run (this test fails there: Accept returned FAILED_PRECONDITION). Now only that
// connection is refused, and this rank's trainer, coming after it, is accepted.
TEST_F(AttachedTrainerAcceptTest, RefusesOnlyTheConnectionOfAnotherRank) {
  std::unique_ptr<FrameSocket> wrong_rank = Connect();
  v1::AttachRequest hello;
  hello.mutable_hello()->set_job_id(kJobId);
  hello.mutable_hello()->set_rank(1);
  hello.mutable_hello()->set_world_size(1);
  ASSERT_TRUE(wrong_rank->Write(hello).ok());
  std::unique_ptr<FrameSocket> live = ConnectAndSayHello();
  AttachedTrainer trainer(Options(absl::Seconds(30)), &backing_);
  const absl::Status accepted = trainer.Accept();
  EXPECT_TRUE(accepted.ok()) << accepted;
  v1::AttachResponse refusal;
  ASSERT_TRUE(wrong_rank->Read(refusal).ok());
  EXPECT_NE(refusal.error().find("rank 1 of 1"), std::string::npos) << refusal.error();
  trainer.Abort();
}

// Issue 25, item 3: a connection that sends nothing held the accept loop for 30 s, and Abort()
// went unseen meanwhile (this test fails there: Accept took 30 s). Now the trainer queued behind
// it is accepted at once, and an Abort() during a silent connection ends Accept at once.
TEST_F(AttachedTrainerAcceptTest, ASilentConnectionHoldsBackNeitherTheTrainerNorAbort) {
  std::unique_ptr<FrameSocket> silent = Connect();
  std::unique_ptr<FrameSocket> live = ConnectAndSayHello();
  AttachedTrainer trainer(Options(absl::Seconds(60)), &backing_);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(trainer.Accept().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // the silent one's 30 s hello wait
  trainer.Abort();

  std::unique_ptr<FrameSocket> another_silent = Connect();
  AttachedTrainer aborted(Options(absl::Seconds(60)), &backing_);
  absl::Status status;
  std::thread accept([&] { status = aborted.Accept(); });
  // Abort once Accept has taken the silent connection in (it polls it with the listener).
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    pollfd listener{listener_->fd(), POLLIN, 0};
    if (::poll(&listener, 1, 0) == 0) break;  // accepted: nothing left in the backlog
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Time aborted_at = absl::Now();
  aborted.Abort();
  accept.join();
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_LT(absl::Now() - aborted_at, absl::Seconds(20));
}

// Issue 25, item 3: the socket's mode followed the umask, and anyone who could connect was
// served (this test fails there: mode 0755 or so, and the peer was accepted). Now the file is
// 0600 (0660 with the group), and a peer the policy does not allow is refused by SO_PEERCRED.
TEST_F(AttachedTrainerAcceptTest, OnlyTheWorkersUserOrGroupMayAttach) {
  struct stat st;
  ASSERT_EQ(::stat(listener_->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  absl::StatusOr<std::unique_ptr<AttachListener>> grouped =
      AttachListener::Create(directory_ + "/grouped.sock", std::to_string(::getegid()));
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  ASSERT_EQ(::stat((*grouped)->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, ::getegid());
  EXPECT_EQ((*grouped)->peers().group, std::optional<gid_t>(::getegid()));
  grouped->reset();
  const absl::Status unknown =
      AttachListener::Create(directory_ + "/x.sock", "no-such-group-zeroshard").status();
  EXPECT_TRUE(absl::IsInvalidArgument(unknown)) << unknown;
  EXPECT_NE(unknown.message().find("attach_group: no group 'no-such-group-zeroshard'"),
            std::string::npos)
      << unknown;

  // This process stands for another user: a policy allowing only some other uid refuses it,
  // naming the flag, and keeps waiting for its trainer.
  std::unique_ptr<FrameSocket> stranger = ConnectAndSayHello();
  AttachedTrainerOptions options = Options(absl::Seconds(2));
  options.peers.uid = ::geteuid() + 1;
  AttachedTrainer trainer(options, &backing_);
  const absl::Status accepted = trainer.Accept();
  EXPECT_TRUE(absl::IsDeadlineExceeded(accepted)) << accepted;
  v1::AttachResponse refusal;
  ASSERT_TRUE(stranger->Read(refusal).ok());
  EXPECT_NE(refusal.error().find("may not attach"), std::string::npos) << refusal.error();
  EXPECT_NE(refusal.error().find("--attach_group"), std::string::npos) << refusal.error();
  // The same process's group allowed: accepted.
  std::unique_ptr<FrameSocket> member = ConnectAndSayHello();
  options = Options(absl::Seconds(30));
  options.peers.uid = ::geteuid() + 1;
  options.peers.group = ::getegid();
  AttachedTrainer by_group(options, &backing_);
  EXPECT_TRUE(by_group.Accept().ok());
  by_group.Abort();
}

}  // namespace
}  // namespace zeroshard::attach
