// The worker's health port over loopback, driven by a real WorkerDaemon against a real in-process
// coordinator: /readyz is 503 before registration and after the coordinator stops answering, 200
// while registered; /healthz stays 200 throughout (a coordinator outage must not restart workers),
// and turns 503 only while the coordinator keeps refusing the worker.
#include "worker/daemon/health_server.h"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/free_port.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "http/http_test_client.h"
#include "worker/daemon/worker_daemon.h"

namespace zeroshard::worker {
namespace {

// GETs `path` until the reply satisfies `accept` or 20 s pass; returns the last reply.
http::testing::HttpReply PollUntil(
    int port, const std::string& path,
    const std::function<bool(const http::testing::HttpReply&)>& accept) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  http::testing::HttpReply last;
  while (absl::Now() < deadline) {
    absl::StatusOr<http::testing::HttpReply> reply =
        http::testing::Get(port, path, absl::Now() + absl::Seconds(5));
    if (reply.ok()) {
      last = *reply;
      if (accept(last)) return last;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return last;
}

http::testing::HttpReply GetOrDie(int port, const std::string& path) {
  absl::StatusOr<http::testing::HttpReply> reply =
      http::testing::Get(port, path, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(reply.ok()) << reply.status();
  return reply.ok() ? *reply : http::testing::HttpReply{};
}

std::unique_ptr<coordinator::CoordinatorServer> StartCoordinator(
    int port, absl::Duration heartbeat_period = absl::Milliseconds(50)) {
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:" + std::to_string(port);
  options.metrics_port = -1;
  options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/state-" + std::to_string(port);
  options.manager.lease.heartbeat_period = heartbeat_period;
  options.tick_period = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
      coordinator::CoordinatorServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// A daemon named "w" of a coordinator on `coordinator_port` whose runs are never made, that
// reconnects quickly after a coordinator restart, as zeroshard-worker does.
std::unique_ptr<WorkerDaemon> MakeDaemon(
    int coordinator_port, absl::Duration unregistered_unhealthy_after = absl::Minutes(5)) {
  WorkerDaemonOptions options;
  options.name = "w";
  options.host = "host-a";
  options.register_retry = absl::Milliseconds(20);
  options.rpc_timeout = absl::Milliseconds(500);
  options.unregistered_unhealthy_after = unregistered_unhealthy_after;
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  channel_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<v1::Coordinator::StubInterface> stub = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(coordinator_port),
                                grpc::InsecureChannelCredentials(), channel_args));
  return std::make_unique<WorkerDaemon>(options, stub,
                                        [](const v1::Assignment&) { return nullptr; });
}

// The daemon's probes, as zeroshard-worker serves them.
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartProbes(WorkerDaemon& daemon) {
  HealthServerOptions health;
  health.readiness = [&daemon] { return daemon.Readiness(); };
  health.liveness = [&daemon] { return daemon.Liveness(); };
  return StartHealthServer(health);
}

TEST(HealthServerTest, ReadyOnlyWhileRegisteredAndHeartbeatingLiveThroughout) {
  const int coordinator_port = common::PickFreeLoopbackPortOrDie();
  // No job is submitted, so no run is ever made.
  std::unique_ptr<WorkerDaemon> daemon_holder = MakeDaemon(coordinator_port);
  WorkerDaemon& daemon = *daemon_holder;
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server = StartProbes(daemon);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  // Before the daemon runs, and while it retries a coordinator that is not there yet.
  http::testing::HttpReply ready = GetOrDie(port, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_TRUE(absl::StrContains(ready.body, "not registered")) << ready.body;
  std::thread thread([&] { EXPECT_TRUE(daemon.Run().ok()); });
  ready = PollUntil(port, "/readyz", [](const http::testing::HttpReply& reply) {
    return absl::StrContains(reply.body, "not registered with the coordinator: ");
  });
  EXPECT_EQ(ready.status, 503) << ready.body;
  EXPECT_EQ(ready.body.find('\n'), ready.body.size() - 1) << "one line: " << ready.body;
  EXPECT_EQ(GetOrDie(port, "/healthz").status, 200);

  std::unique_ptr<coordinator::CoordinatorServer> coordinator = StartCoordinator(coordinator_port);
  ASSERT_NE(coordinator, nullptr);
  ready = PollUntil(port, "/readyz",
                    [](const http::testing::HttpReply& reply) { return reply.status == 200; });
  EXPECT_EQ(ready.status, 200) << ready.body;
  EXPECT_EQ(ready.body, "ready\n");

  // The coordinator stops answering: not ready (no new work can reach this worker), still live.
  coordinator.reset();
  ready = PollUntil(port, "/readyz",
                    [](const http::testing::HttpReply& reply) { return reply.status == 503; });
  EXPECT_EQ(ready.status, 503);
  EXPECT_TRUE(absl::StrContains(ready.body, "last heartbeat failed")) << ready.body;
  EXPECT_EQ(GetOrDie(port, "/healthz").status, 200);
  EXPECT_EQ(GetOrDie(port, "/healthz").body, "ok\n");

  daemon.Stop();
  thread.join();
  ready = GetOrDie(port, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "stopping\n");
}

// Issue 23: /healthz turns 503 only when the coordinator keeps refusing the worker (here its
// name stays held by another live registration) for longer than unregistered_unhealthy_after,
// and 200 again once it registers.
TEST(HealthServerTest, UnhealthyOnlyWhileRefusedLongerThanTheBound) {
  const int coordinator_port = common::PickFreeLoopbackPortOrDie();
  // Leases of 1.5 s: the test's renewals of the holder may be far apart on a loaded machine.
  std::unique_ptr<coordinator::CoordinatorServer> coordinator =
      StartCoordinator(coordinator_port, absl::Milliseconds(500));
  ASSERT_NE(coordinator, nullptr);
  v1::RegisterWorkerRequest holder_request;
  holder_request.set_name("w");
  holder_request.set_host("host-b");
  holder_request.set_device_kind(v1::CPU);
  absl::StatusOr<v1::RegisterWorkerResponse> holder =
      coordinator->manager()->RegisterWorker(holder_request);
  ASSERT_TRUE(holder.ok()) << holder.status();
  v1::HeartbeatRequest renew;
  renew.set_worker_id(holder->worker_id());

  std::unique_ptr<WorkerDaemon> daemon_holder =
      MakeDaemon(coordinator_port, absl::Milliseconds(200));
  WorkerDaemon& daemon = *daemon_holder;
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server = StartProbes(daemon);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::thread thread([&] { EXPECT_TRUE(daemon.Run().ok()); });

  // The holder beats on (from here), so every registration of "w" is refused.
  http::testing::HttpReply live = PollUntil(port, "/healthz", [&](const auto& reply) {
    EXPECT_TRUE(coordinator->manager()->Heartbeat(renew).ok());
    return reply.status == 503;
  });
  EXPECT_EQ(live.status, 503) << live.body;
  EXPECT_TRUE(absl::StrContains(live.body, "refused this worker a registration")) << live.body;
  EXPECT_TRUE(absl::StrContains(live.body, holder->worker_id())) << live.body;
  EXPECT_EQ(GetOrDie(port, "/readyz").status, 503);

  // The holder stops beating and dies: the daemon registers, healthy and ready again.
  live = PollUntil(port, "/healthz", [](const auto& reply) { return reply.status == 200; });
  EXPECT_EQ(live.status, 200) << live.body;
  http::testing::HttpReply ready =
      PollUntil(port, "/readyz", [](const auto& reply) { return reply.status == 200; });
  EXPECT_EQ(ready.status, 200) << ready.body;
  daemon.Stop();
  thread.join();
}

TEST(HealthServerTest, AMultiLineReasonIsAnsweredOnOneLine) {
  HealthServerOptions options;
  options.readiness = [] { return absl::UnavailableError("first line\nsecond line"); };
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server = StartHealthServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const http::testing::HttpReply ready = GetOrDie((*server)->port(), "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "first line second line\n");
}

TEST(HealthServerTest, RefusesAMissingReadinessAndAPortInUse) {
  HealthServerOptions no_readiness;
  EXPECT_EQ(StartHealthServer(no_readiness).status().code(), absl::StatusCode::kInvalidArgument);

  HealthServerOptions first;
  first.readiness = [] { return absl::OkStatus(); };
  absl::StatusOr<std::unique_ptr<http::HttpServer>> started = StartHealthServer(first);
  ASSERT_TRUE(started.ok()) << started.status();
  HealthServerOptions same_port = first;
  same_port.port = (*started)->port();
  const absl::Status in_use = StartHealthServer(same_port).status();
  EXPECT_FALSE(in_use.ok());
  EXPECT_TRUE(absl::StartsWith(in_use.message(), "port: ")) << in_use;
}

}  // namespace
}  // namespace zeroshard::worker
