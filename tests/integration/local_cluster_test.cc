// Self-test of the LocalCluster fixture against the real binaries: the coordinator serves and
// stops cleanly, workers register as IDLE, a worker started before the coordinator registers
// once it is up, SIGTERM makes a worker LEFT and SIGKILL makes it DEAD.
#include "tests/integration/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zeroshard::testing {
namespace {

int CountInFile(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string contents = text.str();
  int count = 0;
  for (size_t at = contents.find(needle); at != std::string::npos;
       at = contents.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

LocalClusterOptions FastHeartbeats() {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(250);
  options.missed_heartbeats = 3;
  return options;
}

TEST(LocalClusterTest, CoordinatorServesAndStopsCleanly) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  EXPECT_FALSE(cluster.coordinator_target().empty());
  EXPECT_GT(cluster.metrics_port(), 0);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers =
      cluster.client().ListWorkers(v1::WORKER_STATE_UNSPECIFIED);
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_TRUE(workers->empty());
  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
  EXPECT_FALSE(cluster.coordinator_process().running());
}

TEST(LocalClusterTest, RestartedCoordinatorKeepsItsAddress) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const std::string target = cluster.coordinator_target();
  ASSERT_TRUE(cluster.StopCoordinator(SIGKILL).ok());
  absl::Status restarted = cluster.StartCoordinator();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_EQ(cluster.coordinator_target(), target);
  EXPECT_TRUE(cluster.client().ListWorkers(v1::WORKER_STATE_UNSPECIFIED).ok());
}

TEST(LocalClusterTest, WaitForReportsTimeoutWithWhat) {
  LocalCluster cluster;
  absl::Status status = cluster.WaitFor([] { return false; }, absl::Milliseconds(50), "never");
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("never"), absl::string_view::npos);
}

TEST(LocalClusterTest, WorkersRegisterAsIdle) {
  LocalCluster cluster(FastHeartbeats());
  absl::Status started = cluster.Start(2);
  ASSERT_TRUE(started.ok()) << started;
  for (const std::string name : {"worker-0", "worker-1"}) {
    absl::StatusOr<v1::WorkerInfo> worker = cluster.FindWorker(name);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_EQ(worker->state(), v1::IDLE);
    EXPECT_EQ(worker->device_kind(), v1::CPU);
  }
  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// The required test: a worker started before the coordinator keeps retrying and
// registers once the coordinator is up.
TEST(LocalClusterTest, WorkerStartedBeforeCoordinatorRegistersOnceItIsUp) {
  LocalCluster cluster(FastHeartbeats());
  ASSERT_TRUE(cluster.ReserveCoordinatorPort().ok());
  absl::StatusOr<int> early = cluster.StartWorker("early");
  ASSERT_TRUE(early.ok()) << early.status();
  // It tried, failed and keeps going: at least two failed attempts, and still running.
  const std::string log = cluster.worker_process(*early).log_path;
  absl::Status retried =
      cluster.WaitFor([&] { return CountInFile(log, "retrying") >= 2; }, absl::Seconds(20),
                      "two failed registration attempts in the early worker's log");
  ASSERT_TRUE(retried.ok()) << retried;
  ASSERT_TRUE(cluster.worker_process(*early).running());

  absl::Status started = cluster.StartCoordinator();
  const absl::Time coordinator_up = absl::Now();
  ASSERT_TRUE(started.ok()) << started;
  absl::Status registered = cluster.WaitForWorkerStates({"early"}, v1::IDLE, absl::Seconds(20));
  const absl::Duration registration_delay = absl::Now() - coordinator_up;
  EXPECT_TRUE(registered.ok()) << registered;
  // Promptly: the worker reconnects at least every second (worker/main.cc caps gRPC's backoff
  // at 1 s) and retries registration every 500 ms, so about 1.5 s at worst; 5 s leaves room
  // for a loaded machine.
  EXPECT_LT(registration_delay, absl::Seconds(5))
      << "registered " << registration_delay << " after the coordinator came up";
  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST(LocalClusterTest, SigtermMakesAWorkerLeftAndExitZero) {
  LocalCluster cluster(FastHeartbeats());
  absl::Status started = cluster.Start(2);
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(cluster.KillWorker(0, SIGTERM).ok());
  absl::StatusOr<int> status = cluster.WaitForWorkerExit(0, absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  absl::Status left = cluster.WaitForWorkerStates({"worker-0"}, v1::LEFT, absl::Seconds(5));
  EXPECT_TRUE(left.ok()) << left;
  absl::StatusOr<v1::WorkerInfo> other = cluster.FindWorker("worker-1");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->state(), v1::IDLE);
}

TEST(LocalClusterTest, SigkillMakesAWorkerDeadAfterItsLease) {
  LocalCluster cluster(FastHeartbeats());
  absl::Status started = cluster.Start(2);
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(cluster.KillWorker(1, SIGKILL).ok());
  absl::StatusOr<int> status = cluster.WaitForWorkerExit(1, absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
  // The lease is 3 x 250 ms; allow generous slack for a loaded machine.
  absl::Status dead = cluster.WaitForWorkerStates({"worker-1"}, v1::DEAD, absl::Seconds(10));
  EXPECT_TRUE(dead.ok()) << dead;
  absl::StatusOr<v1::WorkerInfo> other = cluster.FindWorker("worker-0");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->state(), v1::IDLE);
}

}  // namespace
}  // namespace zeroshard::testing
