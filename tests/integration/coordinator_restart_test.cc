// Durability across kill -9: runs the real zeroshard-coordinator binary, submits jobs (one of
// them running), SIGKILLs it, restarts it on the same --state_dir and finds every job and event;
// the running job's generation is adopted when its worker comes back, and ends when it does not.
// With TLS and tokens, only the worker that held a rank (its secret) adopts it.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_credentials.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

constexpr absl::Duration kStartDeadline = absl::Seconds(20);
constexpr absl::Duration kRpcDeadline = absl::Seconds(10);

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
}

// One zeroshard-coordinator process. The destructor SIGKILLs it if it still runs.
class CoordinatorProcess {
 public:
  // `extra_flags` are appended to every start's command line.
  CoordinatorProcess(std::string state_dir, std::string port_file,
                     std::vector<std::string> extra_flags = {})
      : state_dir_(std::move(state_dir)),
        port_file_(std::move(port_file)),
        extra_flags_(std::move(extra_flags)) {}
  ~CoordinatorProcess() { Kill(); }

  // Starts the binary and waits (polling, within a deadline) until it wrote its port file.
  ::testing::AssertionResult Start() {
    std::filesystem::remove(port_file_);
    const std::string binary =
        Env("TEST_SRCDIR") + "/zeroshard/apps/coordinator/zeroshard-coordinator";
    std::vector<std::string> args = {binary, "--listen=127.0.0.1:0", "--metrics_port=0",
                                     "--port_file=" + port_file_, "--state_dir=" + state_dir_,
                                     // Long leases: the test worker need not keep beating.
                                     "--heartbeat_period=10s"};
    args.insert(args.end(), extra_flags_.begin(), extra_flags_.end());
    pid_ = fork();
    if (pid_ < 0) return ::testing::AssertionFailure() << "fork failed";
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + kStartDeadline;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure() << binary << " exited early, status " << status;
      }
      std::ifstream ports(port_file_);
      int metrics_port = 0;
      if (ports >> grpc_port_ >> metrics_port && grpc_port_ > 0) {
        if (credentials_ != nullptr) {
          stub_ = CallerStub(*credentials_, target(), credentials_->admin_token);
        } else {
          channel_ = grpc::CreateChannel(target(), grpc::InsecureChannelCredentials());
          stub_ = v1::Coordinator::NewStub(channel_);
        }
        return ::testing::AssertionSuccess();
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return ::testing::AssertionFailure()
           << "no port file " << port_file_ << " within " << kStartDeadline;
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    stub_.reset();
    channel_.reset();
  }

  v1::Coordinator::Stub& stub() { return *stub_; }
  std::string target() const { return absl::StrCat("127.0.0.1:", grpc_port_); }
  // With TLS and the token file of `credentials` (which must outlive this); stub() is then the
  // admin's.
  void Secure(const ClusterCredentials* credentials) {
    credentials_ = credentials;
    extra_flags_.push_back("--tls_cert_file=" + credentials->security.tls_cert_file);
    extra_flags_.push_back("--tls_key_file=" + credentials->security.tls_key_file);
    extra_flags_.push_back("--token_file=" + credentials->security.token_file);
  }

 private:
  const std::string state_dir_;
  const std::string port_file_;
  std::vector<std::string> extra_flags_;
  const ClusterCredentials* credentials_ = nullptr;
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

v1::JobSpec Spec(const std::string& name, int workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_min_workers(workers);
  spec.set_max_workers(workers);
  spec.set_global_batch(64);
  return spec;
}

v1::Job Submit(v1::Coordinator::Stub& stub, const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status status = stub.SubmitJob(&context, request, &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return job;
}

// The registration of the test's one worker.
v1::RegisterWorkerRequest RestartWorkerRequest() {
  v1::RegisterWorkerRequest request;
  request.set_name("restart-worker");
  request.set_host("host-a");
  request.set_device_kind(v1::CPU);
  return request;
}

v1::RegisterWorkerResponse RegisterWorker(v1::Coordinator::Stub& stub,
                                          const v1::RegisterWorkerRequest& request) {
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status status = stub.RegisterWorker(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

v1::Assignment Heartbeat(v1::Coordinator::Stub& stub, const std::string& worker_id,
                         const v1::WorkerStatus& status = {}) {
  v1::HeartbeatRequest request;
  request.set_worker_id(worker_id);
  *request.mutable_status() = status;
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status sent = stub.Heartbeat(&context, request, &response);
  EXPECT_TRUE(sent.ok()) << sent.error_message();
  return response.assignment();
}

v1::Job GetJob(v1::Coordinator::Stub& stub, const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status status = stub.GetJob(&context, request, &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return job;
}

// The first `count` events of a job's history (WatchJob from the start; the stream of a job
// that has not ended stays open, so it is cancelled after `count` events).
std::vector<v1::JobEvent> History(v1::Coordinator::Stub& stub, const std::string& job_id,
                                  int count) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub.WatchJob(&context, request);
  std::vector<v1::JobEvent> events;
  v1::JobEvent event;
  while (static_cast<int>(events.size()) < count && reader->Read(&event)) events.push_back(event);
  context.TryCancel();
  while (reader->Read(&event)) {
  }
  reader->Finish().IgnoreError();
  return events;
}

TEST(CoordinatorRestartTest, JobsAndHistorySurviveKillNineAndTheRunningJobIsAdopted) {
  const std::string tmp = Env("TEST_TMPDIR");
  const std::string state_dir = tmp + "/coordinator-state";
  std::filesystem::remove_all(state_dir);
  CoordinatorProcess coordinator(state_dir, tmp + "/coordinator.ports");
  ASSERT_TRUE(coordinator.Start());

  // A worker registers and beats; the one-worker job runs on it.
  const v1::RegisterWorkerRequest register_request = RestartWorkerRequest();
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(coordinator.stub().RegisterWorker(&context, register_request, &registered).ok());
  }
  const v1::Job running = Submit(coordinator.stub(), Spec("runs", 1));
  const v1::Job pending = Submit(coordinator.stub(), Spec("waits-for-four", 4));
  const v1::Job cancelled = Submit(coordinator.stub(), Spec("cancelled", 2));
  {
    v1::CancelJobRequest request;
    request.set_job_id(cancelled.id());
    request.set_reason("changed my mind");
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(coordinator.stub().CancelJob(&context, request, &job).ok());
  }
  {
    v1::HeartbeatRequest request;
    request.set_worker_id(registered.worker_id());
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(coordinator.stub().Heartbeat(&context, request, &response).ok());
    EXPECT_EQ(response.assignment().kind(), v1::ASSIGNMENT_RUN);
    EXPECT_EQ(response.assignment().job_id(), running.id());
  }
  ASSERT_EQ(GetJob(coordinator.stub(), running.id()).state(), v1::RUNNING);
  ASSERT_EQ(GetJob(coordinator.stub(), pending.id()).state(), v1::PENDING);
  ASSERT_EQ(GetJob(coordinator.stub(), cancelled.id()).state(), v1::CANCELLED);

  // Submitted (PENDING), GENERATION_STARTED, RUNNING / submitted / submitted, CANCELLED.
  const std::map<std::string, int> event_counts = {
      {running.id(), 3}, {pending.id(), 1}, {cancelled.id(), 2}};
  std::map<std::string, std::vector<v1::JobEvent>> before;
  for (const auto& [id, count] : event_counts) {
    before[id] = History(coordinator.stub(), id, count);
    ASSERT_EQ(static_cast<int>(before[id].size()), count) << id;
  }

  coordinator.Kill();
  ASSERT_TRUE(coordinator.Start());

  v1::ListJobsResponse listed;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(coordinator.stub().ListJobs(&context, v1::ListJobsRequest(), &listed).ok());
  }
  ASSERT_EQ(listed.jobs_size(), 3);

  // The running job keeps running: the coordinator waits for its worker to come back.
  const v1::Job adopting = GetJob(coordinator.stub(), running.id());
  EXPECT_EQ(adopting.state(), v1::RUNNING);
  EXPECT_EQ(adopting.generation(), 1);
  EXPECT_TRUE(MessageDifferencer::Equals(adopting.spec(), running.spec()));
  const v1::Job still_pending = GetJob(coordinator.stub(), pending.id());
  EXPECT_EQ(still_pending.state(), v1::PENDING);
  EXPECT_TRUE(MessageDifferencer::Equals(still_pending.create_time(), pending.create_time()));
  const v1::Job still_cancelled = GetJob(coordinator.stub(), cancelled.id());
  EXPECT_EQ(still_cancelled.state(), v1::CANCELLED);
  EXPECT_TRUE(absl::StrContains(still_cancelled.message(), "changed my mind"));

  // Every event survived, unchanged; the running job gained one: a NOTICE that it is adopting.
  for (const auto& [id, count] : event_counts) {
    const int expected = id == running.id() ? count + 1 : count;
    const std::vector<v1::JobEvent> after = History(coordinator.stub(), id, expected);
    ASSERT_EQ(static_cast<int>(after.size()), expected) << id;
    for (int i = 0; i < count; ++i) {
      EXPECT_TRUE(MessageDifferencer::Equals(after[i], before[id][i]))
          << id << " event " << i << ":\n"
          << after[i].DebugString() << "vs\n"
          << before[id][i].DebugString();
    }
    if (id == running.id()) {
      EXPECT_EQ(after.back().sequence(), count + 1);
      EXPECT_EQ(after.back().type(), v1::NOTICE);
      EXPECT_TRUE(absl::StrContains(after.back().message(), "coordinator restarted: adopting"))
          << after.back().message();
    }
  }

  // Membership is soft state: the old worker id is unknown and must register again.
  {
    v1::HeartbeatRequest request;
    request.set_worker_id(registered.worker_id());
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    EXPECT_EQ(coordinator.stub().Heartbeat(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Presenting its old id and its run, it gets both back: the generation goes on.
  v1::RegisterWorkerRequest back = register_request;
  back.set_previous_worker_id(registered.worker_id());
  back.mutable_status()->set_job_id(running.id());
  back.mutable_status()->set_generation(1);
  back.mutable_status()->set_rank(0);
  back.mutable_status()->set_step(12);
  const v1::RegisterWorkerResponse adopted = RegisterWorker(coordinator.stub(), back);
  EXPECT_TRUE(adopted.adopted());
  EXPECT_EQ(adopted.worker_id(), registered.worker_id());
  const v1::Assignment assignment =
      Heartbeat(coordinator.stub(), adopted.worker_id(), back.status());
  EXPECT_EQ(assignment.kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(assignment.job_id(), running.id());
  EXPECT_EQ(assignment.generation(), 1);
  const v1::Job continued = GetJob(coordinator.stub(), running.id());
  EXPECT_EQ(continued.state(), v1::RUNNING);
  EXPECT_EQ(continued.message(), "generation 1 adopted after a coordinator restart");
  EXPECT_EQ(continued.generation(), 1);
  EXPECT_EQ(continued.attempts(), 1);
  // New ids continue after the old ones.
  const v1::Job next = Submit(coordinator.stub(), Spec("after-restart", 4));
  EXPECT_EQ(next.id(), "job-000004");
}

TEST(CoordinatorRestartTest, ARunningJobWhoseWorkerDoesNotComeBackStartsANewGeneration) {
  const std::string tmp = Env("TEST_TMPDIR");
  const std::string state_dir = tmp + "/coordinator-state-not-back";
  std::filesystem::remove_all(state_dir);
  CoordinatorProcess coordinator(state_dir, tmp + "/coordinator-not-back.ports",
                                 {"--adoption_window=1s"});
  ASSERT_TRUE(coordinator.Start());
  const v1::RegisterWorkerRequest register_request = RestartWorkerRequest();
  const v1::RegisterWorkerResponse registered =
      RegisterWorker(coordinator.stub(), register_request);
  const v1::Job running = Submit(coordinator.stub(), Spec("runs", 1));
  ASSERT_EQ(Heartbeat(coordinator.stub(), registered.worker_id()).kind(), v1::ASSIGNMENT_RUN);

  coordinator.Kill();
  ASSERT_TRUE(coordinator.Start());
  // No worker presents the run: when the window ends, so does the generation.
  const absl::Time deadline = absl::Now() + kStartDeadline;
  v1::Job ended = GetJob(coordinator.stub(), running.id());
  while (ended.state() == v1::RUNNING && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    ended = GetJob(coordinator.stub(), running.id());
  }
  EXPECT_EQ(ended.state(), v1::RECOVERING);
  EXPECT_TRUE(absl::StrContains(
      ended.message(), "generation 1 ended: coordinator restarted: ranks 0 did not come back"))
      << ended.message();
  // A worker registering afresh (with an id no earlier incarnation gave out) runs generation 2.
  const v1::RegisterWorkerResponse registered_again =
      RegisterWorker(coordinator.stub(), register_request);
  EXPECT_FALSE(registered_again.adopted());
  EXPECT_NE(registered_again.worker_id(), registered.worker_id());
  const v1::Job restarted = GetJob(coordinator.stub(), running.id());
  EXPECT_EQ(restarted.state(), v1::RUNNING);
  EXPECT_EQ(restarted.generation(), 2);
  EXPECT_EQ(restarted.attempts(), 2);
}

// Before issue 23 the restarted coordinator answered the worker's heartbeat PERMISSION_DENIED
// (no secrets after a restart) instead of NOT_FOUND, and adopted the rank for any worker-token
// caller that named its id and run.
TEST(CoordinatorRestartTest, WithTokensOnlyTheRanksOwnWorkerAdoptsItAfterAKillNine) {
  const std::string tmp = Env("TEST_TMPDIR");
  absl::StatusOr<ClusterCredentials> credentials = MakeClusterCredentials(tmp + "/pki");
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  const std::string state_dir = tmp + "/coordinator-state-tokens";
  std::filesystem::remove_all(state_dir);
  CoordinatorProcess coordinator(state_dir, tmp + "/coordinator-tokens.ports");
  coordinator.Secure(&*credentials);
  ASSERT_TRUE(coordinator.Start());

  const v1::RegisterWorkerRequest register_request = RestartWorkerRequest();
  v1::RegisterWorkerResponse registered;
  {
    std::unique_ptr<v1::Coordinator::Stub> worker =
        CallerStub(*credentials, coordinator.target(), credentials->worker_token);
    registered = RegisterWorker(*worker, register_request);
  }
  ASSERT_EQ(registered.worker_secret().size(), 64u);
  std::unique_ptr<v1::Coordinator::Stub> worker = CallerStub(
      *credentials, coordinator.target(), credentials->worker_token, registered.worker_secret());
  const v1::Job running = Submit(coordinator.stub(), Spec("runs", 1));
  ASSERT_EQ(Heartbeat(*worker, registered.worker_id()).kind(), v1::ASSIGNMENT_RUN);

  coordinator.Kill();
  ASSERT_TRUE(coordinator.Start());
  worker = CallerStub(*credentials, coordinator.target(), credentials->worker_token,
                      registered.worker_secret());
  // Unknown now, not refused: the worker registers again.
  {
    v1::HeartbeatRequest request;
    request.set_worker_id(registered.worker_id());
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    EXPECT_EQ(worker->Heartbeat(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  v1::RegisterWorkerRequest back = register_request;
  back.set_previous_worker_id(registered.worker_id());
  back.mutable_status()->set_job_id(running.id());
  back.mutable_status()->set_generation(1);
  back.mutable_status()->set_rank(0);
  // Another caller with the worker token, without the secret, under another name: a new worker.
  v1::RegisterWorkerRequest claim = back;
  claim.set_name("intruder");
  {
    std::unique_ptr<v1::Coordinator::Stub> intruder =
        CallerStub(*credentials, coordinator.target(), credentials->worker_token);
    const v1::RegisterWorkerResponse refused = RegisterWorker(*intruder, claim);
    EXPECT_FALSE(refused.adopted());
    EXPECT_NE(refused.worker_id(), registered.worker_id());
  }
  // The worker itself, presenting its secret, gets its id and run back.
  const v1::RegisterWorkerResponse adopted = RegisterWorker(*worker, back);
  EXPECT_TRUE(adopted.adopted());
  EXPECT_EQ(adopted.worker_id(), registered.worker_id());
  // It keeps the secret it proved itself with (calls its run has in flight carry it).
  EXPECT_EQ(adopted.worker_secret(), registered.worker_secret());
  worker = CallerStub(*credentials, coordinator.target(), credentials->worker_token,
                      adopted.worker_secret());
  const v1::Assignment assignment = Heartbeat(*worker, adopted.worker_id(), back.status());
  EXPECT_EQ(assignment.kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(assignment.job_id(), running.id());
  EXPECT_EQ(GetJob(coordinator.stub(), running.id()).message(),
            "generation 1 adopted after a coordinator restart");

  // A second restart: the same secret proves the rank again.
  coordinator.Kill();
  ASSERT_TRUE(coordinator.Start());
  worker = CallerStub(*credentials, coordinator.target(), credentials->worker_token,
                      adopted.worker_secret());
  EXPECT_TRUE(RegisterWorker(*worker, back).adopted());
}

}  // namespace
}  // namespace zeroshard::testing
