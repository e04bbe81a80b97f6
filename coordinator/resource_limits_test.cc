// The coordinator's resource limits over real gRPC: each one, set small, refuses the next call
// with RESOURCE_EXHAUSTED naming its flag while other calls keep working, and freeing lets in more.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/clock.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/test_rpc_support.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {
namespace {

using Stub = v1::Coordinator::Stub;

// Expects `status` to be RESOURCE_EXHAUSTED with a message starting "<flag>:".
void ExpectExhausted(const grpc::Status& status, const std::string& flag) {
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(absl::StartsWith(status.error_message(), absl::StrCat(flag, ":")))
      << status.error_message();
}

// One open WatchJob stream, its first event read (so the server has admitted it).
struct OpenWatch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
  v1::JobEvent first;
  bool admitted = false;
};

// A loopback TCP proxy to a port that can be frozen: it then stops passing bytes either way but
// keeps the connections open, as a client whose host vanished from the network would.
// Thread contract: Freeze and the destructor from the test's thread; one forwarding thread.
class FreezableProxy {
 public:
  explicit FreezableProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = Loopback(0);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(listen_fd_, 8), 0);
    socklen_t length = sizeof(address);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    wake_fd_ = ::eventfd(0, 0);
    thread_ = std::thread([this] { Run(); });
  }

  ~FreezableProxy() {
    stopping_.store(true);
    Wake();
    thread_.join();
    for (const auto& [client, server] : pairs_) {
      ::close(client);
      ::close(server);
    }
    ::close(listen_fd_);
    ::close(wake_fd_);
  }

  int port() const { return port_; }

  void Freeze() {
    frozen_.store(true);
    Wake();
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
  }

  void Wake() {
    const uint64_t one = 1;
    EXPECT_EQ(::write(wake_fd_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  }

  // Copies what `from` has to `to`; false once `from` closed or either failed.
  static bool Forward(int from, int to) {
    char buffer[65536];
    const ssize_t n = ::read(from, buffer, sizeof(buffer));
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t wrote = ::write(to, buffer + sent, static_cast<size_t>(n - sent));
      if (wrote <= 0) return false;
      sent += wrote;
    }
    return true;
  }

  void Run() {
    while (!stopping_.load()) {
      std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      const bool frozen = frozen_.load();
      if (!frozen) {
        for (const auto& [client, server] : pairs_) {
          fds.push_back({client, POLLIN, 0});
          fds.push_back({server, POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) return;
      if (fds[0].revents != 0) {
        uint64_t count;
        EXPECT_EQ(::read(wake_fd_, &count, sizeof(count)), static_cast<ssize_t>(sizeof(count)));
      }
      if (fds[1].revents != 0) {
        const int client = ::accept(listen_fd_, nullptr, nullptr);
        const int server = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in target = Loopback(target_port_);
        if (client >= 0 &&
            ::connect(server, reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0) {
          pairs_.emplace_back(client, server);
        } else {
          if (client >= 0) ::close(client);
          ::close(server);
        }
      }
      if (frozen) continue;
      for (size_t i = 2; i < fds.size(); i += 2) {
        const auto [client, server] = pairs_[(i - 2) / 2];
        const bool ok = (fds[i].revents == 0 || Forward(client, server)) &&
                        (fds[i + 1].revents == 0 || Forward(server, client));
        if (!ok) {
          // Either side closing ends both; the next poll no longer lists them.
          ::shutdown(client, SHUT_RDWR);
          ::shutdown(server, SHUT_RDWR);
        }
      }
    }
  }

  const int target_port_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stopping_{false};
  // Touched by the forwarding thread only, and by the destructor after joining it.
  std::vector<std::pair<int, int>> pairs_;
  std::thread thread_;
};

class ResourceLimitsTest : public ::testing::Test {
 protected:
  void StartServer(CoordinatorServerOptions options) {
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-state");
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  grpc::Status Submit(const v1::JobSpec& spec, v1::Job* job) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->SubmitJob(&context, request, job);
  }

  std::string Register(const std::string& name) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_host(name);
    request.set_device_kind(v1::CPU);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.worker_id();
  }

  grpc::Status GetJob(const std::string& job_id, v1::Job* job) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->GetJob(&context, request, job);
  }

  std::unique_ptr<OpenWatch> Watch(const std::string& job_id) {
    auto watch = std::make_unique<OpenWatch>();
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    SetDeadline(watch->context, absl::Seconds(30));
    watch->reader = stub_->WatchJob(&watch->context, request);
    watch->admitted = watch->reader->Read(&watch->first);
    return watch;
  }

  grpc::Status StoreSet(const v1::Job& job, const std::string& key, const std::string& value) {
    v1::StoreSetRequest request;
    request.set_job_id(job.id());
    request.set_generation(job.generation());
    request.set_key(key);
    request.set_value(value);
    v1::StoreSetResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->StoreSet(&context, request, &response);
  }

  grpc::Status StoreDelete(const v1::Job& job, const std::string& key) {
    v1::StoreDeleteRequest request;
    request.set_job_id(job.id());
    request.set_generation(job.generation());
    request.set_key(key);
    v1::StoreDeleteResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->StoreDelete(&context, request, &response);
  }

  // A running one-worker job, for the rendezvous store's tests.
  v1::Job RunningJob() {
    Register("store-host");
    v1::Job submitted;
    const grpc::Status status = Submit(Spec("store-user", 1), &submitted);
    EXPECT_TRUE(status.ok()) << status.error_message();
    v1::Job job;
    EXPECT_TRUE(GetJob(submitted.id(), &job).ok());
    EXPECT_EQ(job.state(), v1::RUNNING);
    return job;
  }

  common::FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

TEST_F(ResourceLimitsTest, WatchStreamsAreCappedInAllAndACancelledOneIsFreed) {
  CoordinatorServerOptions options;
  options.service.max_watch_streams = 2;
  StartServer(options);
  // No workers: the job stays PENDING and quiet, so nothing but the cancel can end its watches.
  v1::Job job;
  ASSERT_TRUE(Submit(Spec("quiet", 1), &job).ok());

  std::unique_ptr<OpenWatch> first = Watch(job.id());
  std::unique_ptr<OpenWatch> second = Watch(job.id());
  ASSERT_TRUE(first->admitted);
  ASSERT_TRUE(second->admitted);
  EXPECT_EQ(server_->service()->OpenWatchStreams(), 2);

  std::unique_ptr<OpenWatch> refused = Watch(job.id());
  EXPECT_FALSE(refused->admitted);
  ExpectExhausted(refused->reader->Finish(), "max_watch_streams");
  v1::Job got;
  EXPECT_TRUE(GetJob(job.id(), &got).ok());

  // The abandoned watch ends on the server (its stream and the manager's hold on it) without
  // waiting for the quiet job's next event.
  first->context.TryCancel();
  EXPECT_EQ(first->reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(server_->service()->AwaitOpenWatchStreams(1, absl::Seconds(10)))
      << server_->service()->OpenWatchStreams() << " open";
  EXPECT_EQ(server_->manager()->Stats().watchers, 1);

  std::unique_ptr<OpenWatch> replacement = Watch(job.id());
  EXPECT_TRUE(replacement->admitted);
  EXPECT_EQ(replacement->first.sequence(), 1);

  second->context.TryCancel();
  replacement->context.TryCancel();
  second->reader->Finish();
  replacement->reader->Finish();
  EXPECT_TRUE(server_->service()->AwaitOpenWatchStreams(0, absl::Seconds(10)));
  EXPECT_EQ(server_->manager()->Stats().watchers, 0);
}

TEST_F(ResourceLimitsTest, WatchStreamsAreCappedPerPeer) {
  CoordinatorServerOptions options;
  options.service.max_watch_streams = 100;
  options.service.max_watch_streams_per_peer = 1;
  StartServer(options);
  v1::Job job;
  ASSERT_TRUE(Submit(Spec("quiet", 1), &job).ok());

  std::unique_ptr<OpenWatch> held = Watch(job.id());
  ASSERT_TRUE(held->admitted);
  // Another connection from the same host counts against the same peer.
  grpc::ChannelArguments args;
  args.SetInt("zeroshard.test_channel", 1);
  std::unique_ptr<Stub> other = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(server_->grpc_target(), grpc::InsecureChannelCredentials(), args));
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = other->WatchJob(&context, request);
  v1::JobEvent event;
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status refused = reader->Finish();
  ExpectExhausted(refused, "max_watch_streams_per_peer");
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "127.0.0.1")) << refused.error_message();
  v1::Job got;
  EXPECT_TRUE(GetJob(job.id(), &got).ok());

  held->context.TryCancel();
  held->reader->Finish();
  ASSERT_TRUE(server_->service()->AwaitOpenWatchStreams(0, absl::Seconds(10)));
  std::unique_ptr<OpenWatch> next = Watch(job.id());
  EXPECT_TRUE(next->admitted);
  next->context.TryCancel();
  next->reader->Finish();
}

TEST_F(ResourceLimitsTest, ParkedStoreGetsAreCappedAndKeysThatExistAreStillServed) {
  CoordinatorServerOptions options;
  options.rendezvous.max_parked_gets = 2;
  StartServer(options);
  const v1::Job job = RunningJob();
  ASSERT_EQ(job.state(), v1::RUNNING);

  struct Get {
    grpc::ClientContext context;
    v1::StoreGetRequest request;
    v1::StoreGetResponse response;
    grpc::Status status;
    bool done = false;
  };
  absl::Mutex mu;
  std::vector<std::unique_ptr<Get>> gets;
  auto park = [&](const std::string& key) {
    auto get = std::make_unique<Get>();
    SetDeadline(get->context, absl::Seconds(30));
    get->request.set_job_id(job.id());
    get->request.set_generation(job.generation());
    get->request.set_key(key);
    get->request.set_timeout_ms(60000);
    Get* raw = get.get();
    stub_->async()->StoreGet(&raw->context, &raw->request, &raw->response,
                             [&mu, raw](grpc::Status status) {
                               absl::MutexLock lock(&mu);
                               raw->status = std::move(status);
                               raw->done = true;
                             });
    gets.push_back(std::move(get));
    return raw;
  };
  auto await_done = [&mu](Get* get) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&get->done), absl::Seconds(10));
  };

  park("late");
  park("late");
  ASSERT_TRUE(server_->rendezvous()->AwaitPendingWaiters(2, absl::Seconds(10)));
  Get* refused = park("late");
  ASSERT_TRUE(await_done(refused));
  {
    absl::MutexLock lock(&mu);
    ExpectExhausted(refused->status, "max_parked_store_gets");
  }
  EXPECT_EQ(server_->rendezvous()->PendingWaiters(), 2);

  // A key that exists needs no parking.
  ASSERT_TRUE(StoreSet(job, "present", "here").ok());
  Get* immediate = park("present");
  ASSERT_TRUE(await_done(immediate));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(immediate->status.ok()) << immediate->status.error_message();
    EXPECT_EQ(immediate->response.value(), "here");
  }

  // Setting the key releases both; then there is room again.
  ASSERT_TRUE(StoreSet(job, "late", "now").ok());
  ASSERT_TRUE(await_done(gets[0].get()));
  ASSERT_TRUE(await_done(gets[1].get()));
  EXPECT_EQ(server_->rendezvous()->PendingWaiters(), 0);
  Get* admitted = park("later");
  EXPECT_TRUE(server_->rendezvous()->AwaitPendingWaiters(1, absl::Seconds(10)));
  ASSERT_TRUE(StoreSet(job, "later", "done").ok());
  ASSERT_TRUE(await_done(admitted));
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(admitted->status.ok()) << admitted->status.error_message();
  EXPECT_EQ(admitted->response.value(), "done");
}

TEST_F(ResourceLimitsTest, StoreBytesPerNamespaceAreCappedAndFreedByDeleteAndOverwrite) {
  CoordinatorServerOptions options;
  options.rendezvous.max_bytes_per_namespace = 1000;
  StartServer(options);
  const v1::Job job = RunningJob();
  ASSERT_EQ(job.state(), v1::RUNNING);

  ASSERT_TRUE(StoreSet(job, "a", std::string(600, 'x')).ok());
  ExpectExhausted(StoreSet(job, "b", std::string(600, 'y')), "max_store_bytes_per_namespace");
  // The refused key was not stored, and the store keeps serving.
  EXPECT_TRUE(StoreSet(job, "small", "1").ok());
  // Overwriting counts the new size only: "a" shrinks to 300, then "b" fits (1+300 + 5+1 +
  // 1+600 = 908 bytes).
  ASSERT_TRUE(StoreSet(job, "a", std::string(300, 'x')).ok());
  ASSERT_TRUE(StoreSet(job, "b", std::string(600, 'y')).ok());
  ExpectExhausted(StoreSet(job, "c", std::string(200, 'z')), "max_store_bytes_per_namespace");
  ASSERT_TRUE(StoreDelete(job, "a").ok());
  EXPECT_TRUE(StoreSet(job, "c", std::string(200, 'z')).ok());
}

TEST_F(ResourceLimitsTest, PendingJobsPerSubmitterAreCappedUntilOneStartsOrEnds) {
  CoordinatorServerOptions options;
  options.manager.max_pending_jobs_per_submitter = 2;
  StartServer(options);
  v1::Job first;
  v1::Job second;
  ASSERT_TRUE(Submit(Spec("queued-1", 1), &first).ok());
  ASSERT_TRUE(Submit(Spec("queued-2", 1), &second).ok());
  v1::Job refused;
  ExpectExhausted(Submit(Spec("queued-3", 1), &refused), "max_pending_jobs_per_submitter");
  v1::ListJobsRequest list;
  v1::ListJobsResponse listed;
  grpc::ClientContext list_context;
  SetDeadline(list_context);
  ASSERT_TRUE(stub_->ListJobs(&list_context, list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 2);

  // Cancelling one frees its place.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(first.id());
  v1::Job cancelled;
  grpc::ClientContext cancel_context;
  SetDeadline(cancel_context);
  ASSERT_TRUE(stub_->CancelJob(&cancel_context, cancel, &cancelled).ok());
  v1::Job third;
  ASSERT_TRUE(Submit(Spec("queued-3", 1), &third).ok());
  ExpectExhausted(Submit(Spec("queued-4", 1), &refused), "max_pending_jobs_per_submitter");

  // So does one starting: a worker takes the oldest pending job.
  Register("runner");
  server_->manager()->Tick();
  v1::Job started;
  ASSERT_TRUE(GetJob(second.id(), &started).ok());
  ASSERT_EQ(started.state(), v1::RUNNING);
  v1::Job fourth;
  EXPECT_TRUE(Submit(Spec("queued-4", 1), &fourth).ok());
}

TEST_F(ResourceLimitsTest, AReplyOverTheSendLimitIsRefusedNamingTheFlag) {
  CoordinatorServerOptions options;
  options.service.max_send_message_bytes = 2000;
  StartServer(options);
  std::vector<std::string> ids;
  for (int i = 0; i < 30; ++i) {
    v1::Job job;
    ASSERT_TRUE(Submit(Spec(absl::StrCat("listed-", i), 1), &job).ok());
    ids.push_back(job.id());
  }
  v1::ListJobsRequest all;
  v1::ListJobsResponse listed;
  grpc::ClientContext context;
  SetDeadline(context);
  ExpectExhausted(stub_->ListJobs(&context, all, &listed), "max_send_message_bytes");

  // A smaller reply still goes out.
  v1::ListJobsRequest one;
  one.set_limit(1);
  grpc::ClientContext one_context;
  SetDeadline(one_context);
  const grpc::Status status = stub_->ListJobs(&one_context, one, &listed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), ids.back());
}

TEST_F(ResourceLimitsTest, AnIdleConnectionIsClosedAfterMaxConnectionIdle) {
  CoordinatorServerOptions options;
  options.grpc_max_connection_idle = absl::Seconds(1);
  StartServer(options);
  v1::Job job;
  ASSERT_TRUE(Submit(Spec("one-call", 1), &job).ok());
  ASSERT_EQ(channel_->GetState(false), GRPC_CHANNEL_READY);
  // The server's GOAWAY takes the channel out of READY; nothing else would.
  const bool left_ready = channel_->WaitForStateChange(
      GRPC_CHANNEL_READY, absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
  EXPECT_TRUE(left_ready);
  EXPECT_NE(channel_->GetState(false), GRPC_CHANNEL_READY);
  // The client reconnects on its next call.
  v1::Job got;
  EXPECT_TRUE(GetJob(job.id(), &got).ok());
}

TEST_F(ResourceLimitsTest, KeepaliveFreesTheWatchOfAClientThatVanished) {
  CoordinatorServerOptions options;
  options.grpc_keepalive_time = absl::Seconds(1);
  options.grpc_keepalive_timeout = absl::Seconds(1);
  StartServer(options);
  v1::Job job;
  ASSERT_TRUE(Submit(Spec("quiet", 1), &job).ok());

  FreezableProxy proxy(server_->grpc_port());
  std::unique_ptr<Stub> through_proxy = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", proxy.port()), grpc::InsecureChannelCredentials()));
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(60));
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      through_proxy->WatchJob(&context, request);
  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  // Answered pings keep a quiet stream open over several keepalive periods.
  EXPECT_FALSE(server_->service()->AwaitOpenWatchStreams(0, absl::Seconds(3)));
  EXPECT_EQ(server_->service()->OpenWatchStreams(), 1);

  proxy.Freeze();
  EXPECT_TRUE(server_->service()->AwaitOpenWatchStreams(0, absl::Seconds(20)))
      << server_->service()->OpenWatchStreams() << " open";
  EXPECT_EQ(server_->manager()->Stats().watchers, 0);
  v1::Job got;
  EXPECT_TRUE(GetJob(job.id(), &got).ok());
  context.TryCancel();
  reader->Finish();
}

}  // namespace
}  // namespace zeroshard::coordinator
