// Identities and roles over real gRPC: the role x RPC matrix written from docs/api.md's table,
// workers bound to their registration and assignment, the progress rules, and submitters.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/clock.h"
#include "coordinator/test_rpc_support.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "security/test_certificates.h"
#include "security/tls_files.h"
#include "zeroshard/reflection/server_reflection_v1alpha.grpc.pb.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {
namespace {

constexpr char kViewerToken[] = "viewer-token-0123456789";
constexpr char kSubmitterToken[] = "submitter-token-0123456789";
constexpr char kOtherSubmitterToken[] = "other-submitter-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";
constexpr char kWorkerToken[] = "worker-token-0123456789";
constexpr char kUnknownToken[] = "unknown-token-0123456789";

// Who calls: the credentials one call carries.
struct Caller {
  std::string label;
  std::string token;  // empty: no authorization header
  std::string worker_secret;
};

// docs/api.md, "Identities and roles": the roles that may call each RPC. Written from the
// document, not from authorization.cc.
const std::map<std::string, std::set<std::string>>& DocumentedRoles() {
  static const auto* table = new std::map<std::string, std::set<std::string>>{
      {"RegisterWorker", {"admin", "worker"}},
      {"Heartbeat", {"admin", "worker"}},
      {"LeaveWorker", {"admin", "worker"}},
      {"ListWorkers", {"viewer", "submitter", "admin"}},
      {"SubmitJob", {"submitter", "admin"}},
      {"GetJob", {"viewer", "submitter", "admin"}},
      {"ListJobs", {"viewer", "submitter", "admin"}},
      {"CancelJob", {"submitter", "admin"}},
      {"WatchJob", {"viewer", "submitter", "admin"}},
      {"GetShardPlan", {"viewer", "submitter", "admin"}},
      {"StoreSet", {"admin", "worker"}},
      {"StoreGet", {"admin", "worker"}},
      {"StoreAdd", {"admin", "worker"}},
      {"StoreDelete", {"admin", "worker"}},
      {"ReportProgress", {"admin", "worker"}},
      {"CommitCheckpoint", {"admin", "worker"}},
      {"RewindJob", {"admin", "worker"}},
      {"ExportCheckpoint", {"viewer", "submitter", "admin"}},
      {"VerifyCheckpoint", {"admin"}},
      {"ServerReflectionInfo", {"viewer", "submitter", "admin"}},
  };
  return *table;
}

class RolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir();
    token_file_ = dir_ + "/tokens.txt";
    FILE* f = std::fopen(token_file_.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "# token role name\n%s viewer vera\n%s submitter sam\n%s submitter sue\n"
                 "%s admin ada\n%s worker node\n",
                 kViewerToken, kSubmitterToken, kOtherSubmitterToken, kAdminToken, kWorkerToken);
    ASSERT_EQ(std::fclose(f), 0);
  }

  // Starts (or restarts, keeping the state directory) the coordinator with the token file.
  void StartServer(bool authenticate = true) {
    server_.reset();
    CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir = dir_ + "/state";
    if (authenticate) options.token_file = token_file_;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  static void Credentials(grpc::ClientContext& context, const Caller& caller) {
    SetDeadline(context);
    if (!caller.token.empty()) context.AddMetadata("authorization", "Bearer " + caller.token);
    if (!caller.worker_secret.empty()) {
      context.AddMetadata("zeroshard-worker-secret", caller.worker_secret);
    }
  }

  // Registers a worker with the worker token; returns its response (id and secret).
  v1::RegisterWorkerResponse RegisterWorker(const std::string& name) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_host("host-" + name);
    request.set_device_kind(v1::CPU);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    Credentials(context, Caller{"worker", kWorkerToken, ""});
    const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  grpc::Status Submit(const Caller& caller, const v1::JobSpec& spec, v1::Job* job) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    grpc::ClientContext context;
    Credentials(context, caller);
    return stub_->SubmitJob(&context, request, job);
  }

  v1::Job GetJob(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    Credentials(context, Caller{"admin", kAdminToken, ""});
    const grpc::Status status = stub_->GetJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  grpc::Status Cancel(const Caller& caller, const std::string& job_id) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    Credentials(context, caller);
    return stub_->CancelJob(&context, request, &job);
  }

  grpc::Status Report(const Caller& caller, const std::string& worker_id, const std::string& job_id,
                      int64_t generation, int32_t rank, int64_t step, bool finished = false) {
    v1::ReportProgressRequest request;
    request.set_worker_id(worker_id);
    request.set_job_id(job_id);
    request.set_generation(generation);
    request.set_rank(rank);
    *request.mutable_metrics() = Metrics(step);
    request.set_finished(finished);
    v1::ReportProgressResponse response;
    grpc::ClientContext context;
    Credentials(context, caller);
    return stub_->ReportProgress(&context, request, &response);
  }

  grpc::Status StoreSet(const Caller& caller, const std::string& job_id, int64_t generation) {
    v1::StoreSetRequest request;
    request.set_job_id(job_id);
    request.set_generation(generation);
    request.set_key("k");
    request.set_value("v");
    v1::StoreSetResponse response;
    grpc::ClientContext context;
    Credentials(context, caller);
    return stub_->StoreSet(&context, request, &response);
  }

  // A worker registered with the worker token and a 1-worker job of `steps` steps running on
  // it, submitted by the admin.
  struct RunningJob {
    std::string worker_id;
    std::string secret;
    v1::Job job;
  };
  RunningJob StartJob(const std::string& name, int64_t steps = 100, int32_t max_attempts = 1) {
    RunningJob running;
    const v1::RegisterWorkerResponse worker = RegisterWorker("w-" + name);
    running.worker_id = worker.worker_id();
    running.secret = worker.worker_secret();
    v1::JobSpec spec = Spec(name, 1);
    spec.set_steps(steps);
    spec.set_max_attempts(max_attempts);
    v1::Job job;
    const grpc::Status submitted = Submit(Caller{"admin", kAdminToken, ""}, spec, &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    running.job = GetJob(job.id());
    EXPECT_EQ(running.job.state(), v1::RUNNING);
    EXPECT_EQ(running.job.worker_ids_size(), 1);
    if (running.job.worker_ids_size() == 1)
      EXPECT_EQ(running.job.worker_ids(0), worker.worker_id());
    return running;
  }

  // Calls every Coordinator RPC as `caller` against `running` (LeaveWorker last: it ends the
  // job) and returns each one's status code by method name.
  std::map<std::string, grpc::StatusCode> CallEveryRpc(const Caller& caller,
                                                       const RunningJob& running) {
    std::map<std::string, grpc::StatusCode> codes;
    const std::string& job_id = running.job.id();
    const int64_t generation = running.job.generation();
    auto call = [&](const std::string& method, auto invoke) {
      grpc::ClientContext context;
      Credentials(context, caller);
      codes[method] = invoke(context).error_code();
    };
    // Fails validation harmlessly (no name) where it is allowed.
    call("RegisterWorker", [&](grpc::ClientContext& context) {
      v1::RegisterWorkerRequest request;
      request.set_device_kind(v1::CPU);
      v1::RegisterWorkerResponse response;
      return stub_->RegisterWorker(&context, request, &response);
    });
    call("Heartbeat", [&](grpc::ClientContext& context) {
      v1::HeartbeatRequest request;
      request.set_worker_id(running.worker_id);
      request.mutable_status()->set_job_id(job_id);
      request.mutable_status()->set_generation(generation);
      v1::HeartbeatResponse response;
      return stub_->Heartbeat(&context, request, &response);
    });
    call("ListWorkers", [&](grpc::ClientContext& context) {
      v1::ListWorkersRequest request;
      v1::ListWorkersResponse response;
      return stub_->ListWorkers(&context, request, &response);
    });
    call("ServerReflectionInfo",
         [&](grpc::ClientContext& context) { return ListServices(context, nullptr); });
    // Fails validation harmlessly (no spec) where it is allowed.
    call("SubmitJob", [&](grpc::ClientContext& context) {
      v1::SubmitJobRequest request;
      v1::Job response;
      return stub_->SubmitJob(&context, request, &response);
    });
    call("GetJob", [&](grpc::ClientContext& context) {
      v1::GetJobRequest request;
      request.set_job_id(job_id);
      v1::Job response;
      return stub_->GetJob(&context, request, &response);
    });
    call("ListJobs", [&](grpc::ClientContext& context) {
      v1::ListJobsRequest request;
      v1::ListJobsResponse response;
      return stub_->ListJobs(&context, request, &response);
    });
    // A job that does not exist: NOT_FOUND where it is allowed.
    call("CancelJob", [&](grpc::ClientContext& context) {
      v1::CancelJobRequest request;
      request.set_job_id("job-999999");
      v1::Job response;
      return stub_->CancelJob(&context, request, &response);
    });
    // A job that does not exist: the stream ends at once with NOT_FOUND where it is allowed.
    call("WatchJob", [&](grpc::ClientContext& context) {
      v1::WatchJobRequest request;
      request.set_job_id("job-999999");
      std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
      v1::JobEvent event;
      while (reader->Read(&event)) {
      }
      return reader->Finish();
    });
    call("GetShardPlan", [&](grpc::ClientContext& context) {
      v1::GetShardPlanRequest request;
      request.set_job_id(job_id);
      v1::ShardPlan response;
      return stub_->GetShardPlan(&context, request, &response);
    });
    call("StoreSet", [&](grpc::ClientContext& context) {
      v1::StoreSetRequest request;
      request.set_job_id(job_id);
      request.set_generation(generation);
      request.set_key("key");
      request.set_value("value");
      v1::StoreSetResponse response;
      return stub_->StoreSet(&context, request, &response);
    });
    call("StoreGet", [&](grpc::ClientContext& context) {
      v1::StoreGetRequest request;
      request.set_job_id(job_id);
      request.set_generation(generation);
      request.set_key("key");
      request.set_timeout_ms(1);
      v1::StoreGetResponse response;
      return stub_->StoreGet(&context, request, &response);
    });
    call("StoreAdd", [&](grpc::ClientContext& context) {
      v1::StoreAddRequest request;
      request.set_job_id(job_id);
      request.set_generation(generation);
      request.set_key("counter");
      request.set_delta(1);
      v1::StoreAddResponse response;
      return stub_->StoreAdd(&context, request, &response);
    });
    call("StoreDelete", [&](grpc::ClientContext& context) {
      v1::StoreDeleteRequest request;
      request.set_job_id(job_id);
      request.set_generation(generation);
      request.set_key("key");
      v1::StoreDeleteResponse response;
      return stub_->StoreDelete(&context, request, &response);
    });
    call("ReportProgress", [&](grpc::ClientContext& context) {
      v1::ReportProgressRequest request;
      request.set_worker_id(running.worker_id);
      request.set_job_id(job_id);
      request.set_generation(generation);
      *request.mutable_metrics() = Metrics(1);
      v1::ReportProgressResponse response;
      return stub_->ReportProgress(&context, request, &response);
    });
    call("CommitCheckpoint", [&](grpc::ClientContext& context) {
      v1::CommitCheckpointRequest request;
      request.set_worker_id(running.worker_id);
      request.set_job_id(job_id);
      request.set_generation(generation);
      request.set_step(1);
      request.set_outcome(v1::CHECKPOINT_SKIPPED);
      request.set_message("matrix test");
      v1::CommitCheckpointResponse response;
      return stub_->CommitCheckpoint(&context, request, &response);
    });
    call("RewindJob", [&](grpc::ClientContext& context) {
      v1::RewindJobRequest request;
      request.set_worker_id(running.worker_id);
      request.set_job_id(job_id);
      request.set_generation(generation);
      request.set_step(0);
      request.set_reason("matrix test");
      v1::RewindJobResponse response;
      return stub_->RewindJob(&context, request, &response);
    });
    // No checkpoint root: FAILED_PRECONDITION where it is allowed.
    call("ExportCheckpoint", [&](grpc::ClientContext& context) {
      v1::ExportCheckpointRequest request;
      request.set_job_id(job_id);
      request.set_step(1);
      std::unique_ptr<grpc::ClientReader<v1::ExportCheckpointChunk>> reader =
          stub_->ExportCheckpoint(&context, request);
      v1::ExportCheckpointChunk chunk;
      while (reader->Read(&chunk)) {
      }
      return reader->Finish();
    });
    // No checkpoint root: FAILED_PRECONDITION where it is allowed.
    call("VerifyCheckpoint", [&](grpc::ClientContext& context) {
      v1::VerifyCheckpointRequest request;
      request.set_job_id(job_id);
      request.set_step(1);
      v1::VerifyCheckpointResponse response;
      return stub_->VerifyCheckpoint(&context, request, &response);
    });
    call("LeaveWorker", [&](grpc::ClientContext& context) {
      v1::LeaveWorkerRequest request;
      request.set_worker_id(running.worker_id);
      v1::LeaveWorkerResponse response;
      return stub_->LeaveWorker(&context, request, &response);
    });
    return codes;
  }

  std::string dir_;
  std::string token_file_;
  common::FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  // One server reflection stream asking list_services; the services listed go to `services` when
  // it is not null. The stream's final status.
  grpc::Status ListServices(grpc::ClientContext& context, std::vector<std::string>* services) {
    auto call =
        grpc::reflection::v1alpha::ServerReflection::NewStub(channel_)->ServerReflectionInfo(
            &context);
    grpc::reflection::v1alpha::ServerReflectionRequest request;
    request.set_list_services("");
    grpc::reflection::v1alpha::ServerReflectionResponse response;
    if (call->Write(request) && call->Read(&response) && services != nullptr) {
      for (const auto& service : response.list_services_response().service()) {
        services->push_back(service.name());
      }
    }
    call->WritesDone();
    while (call->Read(&response)) {
    }
    return call->Finish();
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(RolesTest, EveryRpcTimesEveryRoleIsAllowedOrRefusedAsDocumented) {
  StartServer();
  struct Row {
    std::string label;
    std::string token;
    // The role the documented table names; empty: not authenticated at all.
    std::string role;
  };
  const std::vector<Row> rows = {
      {"no credentials", "", ""},         {"unknown token", kUnknownToken, ""},
      {"viewer", kViewerToken, "viewer"}, {"submitter", kSubmitterToken, "submitter"},
      {"admin", kAdminToken, "admin"},    {"worker", kWorkerToken, "worker"},
  };
  int row_number = 0;
  for (const Row& row : rows) {
    SCOPED_TRACE(row.label);
    const RunningJob running = StartJob(absl::StrCat("matrix-", row_number++));
    // The worker row presents the secret of the worker it acts as.
    const Caller caller{row.label, row.token, row.role == "worker" ? running.secret : ""};
    const std::map<std::string, grpc::StatusCode> codes = CallEveryRpc(caller, running);
    ASSERT_EQ(codes.size(), DocumentedRoles().size());
    for (const auto& [method, roles] : DocumentedRoles()) {
      ASSERT_EQ(codes.count(method), 1u) << method;
      const grpc::StatusCode code = codes.at(method);
      if (row.role.empty()) {
        EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << method;
      } else if (roles.count(row.role) > 0) {
        EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED) << method;
        EXPECT_NE(code, grpc::StatusCode::PERMISSION_DENIED) << method;
      } else {
        EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << method;
      }
    }
  }
}

TEST_F(RolesTest, HealthIsOpenAndReflectionNeedsAReader) {
  StartServer();
  std::vector<std::string> services;
  {
    grpc::ClientContext context;
    Credentials(context, Caller{"viewer", kViewerToken, ""});
    const grpc::Status status = ListServices(context, &services);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_NE(std::find(services.begin(), services.end(), "zeroshard.v1.Coordinator"),
              services.end());
  }
  {
    grpc::ClientContext context;
    Credentials(context, Caller{"no credentials", "", ""});
    services.clear();
    EXPECT_EQ(ListServices(context, &services).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(services.empty());
  }
  void* tag = nullptr;
  bool ok = false;

  // The health service answers without credentials.
  grpc::ByteBuffer reply;
  grpc::ClientContext health_context;
  SetDeadline(health_context);
  grpc::CompletionQueue health_queue;
  grpc::GenericStub health(channel_);
  grpc::Slice empty_request("");
  grpc::ByteBuffer request(&empty_request, 1);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader = health.PrepareUnaryCall(
      &health_context, "/grpc.health.v1.Health/Check", request, &health_queue);
  reader->StartCall();
  grpc::Status health_status;
  int health_tag = 0;
  reader->Finish(&reply, &health_status, &health_tag);
  ASSERT_EQ(health_queue.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + kRpcDeadline)),
            grpc::CompletionQueue::GOT_EVENT);
  EXPECT_TRUE(health_status.ok()) << health_status.error_message();
  health_queue.Shutdown();
  while (health_queue.Next(&tag, &ok)) {
  }
}

TEST_F(RolesTest, AWorkerActsOnlyForItsOwnRegistrationAndAssignment) {
  StartServer();
  const RunningJob mine = StartJob("mine");
  const RunningJob theirs = StartJob("theirs");
  const Caller me{"worker", kWorkerToken, mine.secret};
  const Caller no_secret{"worker", kWorkerToken, ""};
  const int64_t generation = mine.job.generation();

  EXPECT_TRUE(Report(me, mine.worker_id, mine.job.id(), generation, 0, 1).ok());
  // Another job, another worker's id, another rank: refused.
  EXPECT_EQ(Report(me, mine.worker_id, theirs.job.id(), generation, 0, 1).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  const grpc::Status as_other = Report(me, theirs.worker_id, theirs.job.id(), generation, 0, 1);
  EXPECT_EQ(as_other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(as_other.error_message(), "worker secret"))
      << as_other.error_message();
  EXPECT_FALSE(absl::StrContains(as_other.error_message(), mine.secret));
  // A worker token without the secret.
  EXPECT_EQ(Report(no_secret, mine.worker_id, mine.job.id(), generation, 0, 1).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // The store: only the generation its worker runs.
  EXPECT_TRUE(StoreSet(me, mine.job.id(), generation).ok());
  EXPECT_EQ(StoreSet(me, theirs.job.id(), theirs.job.generation()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(StoreSet(me, mine.job.id(), generation + 1).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(StoreSet(no_secret, mine.job.id(), generation).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // An admin is bound to no secret.
  EXPECT_TRUE(StoreSet(Caller{"admin", kAdminToken, ""}, theirs.job.id(), generation).ok());

  // Issue 23: a worker token names no one. Naming mine's id without its secret takes neither
  // its name (bound while it is live; this failed before: the registration revoked mine's
  // secret and replaced it) ...
  v1::RegisterWorkerRequest again;
  again.set_name("w-mine");
  again.set_host("host-w-mine");
  again.set_device_kind(v1::CPU);
  again.set_previous_worker_id(mine.worker_id);
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext context;
    Credentials(context, no_secret);
    const grpc::Status status = stub_->RegisterWorker(&context, again, &registered);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_TRUE(absl::StrContains(status.error_message(), mine.worker_id))
        << status.error_message();
  }
  // ... nor, under another name, its registration: that is a new worker, and mine's secret
  // still works.
  v1::RegisterWorkerRequest impostor = again;
  impostor.set_name("w-impostor");
  {
    grpc::ClientContext context;
    Credentials(context, no_secret);
    ASSERT_TRUE(stub_->RegisterWorker(&context, impostor, &registered).ok());
  }
  EXPECT_NE(registered.worker_id(), mine.worker_id);
  EXPECT_FALSE(registered.adopted());
  v1::HeartbeatRequest beat;
  beat.set_worker_id(mine.worker_id);
  v1::HeartbeatResponse beat_response;
  {
    grpc::ClientContext context;
    Credentials(context, me);
    EXPECT_TRUE(stub_->Heartbeat(&context, beat, &beat_response).ok());
  }
  // With its secret, the worker itself registers again: a new secret, and the old one (of a
  // registration that has left) stops working.
  {
    grpc::ClientContext context;
    Credentials(context, me);
    ASSERT_TRUE(stub_->RegisterWorker(&context, again, &registered).ok());
  }
  EXPECT_NE(registered.worker_secret(), mine.secret);
  EXPECT_EQ(registered.worker_secret().size(), 64u);
  {
    grpc::ClientContext context;
    Credentials(context, me);
    EXPECT_EQ(stub_->Heartbeat(&context, beat, &beat_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  beat.set_worker_id(registered.worker_id());
  {
    grpc::ClientContext context;
    Credentials(context, Caller{"worker", kWorkerToken, registered.worker_secret()});
    EXPECT_TRUE(stub_->Heartbeat(&context, beat, &beat_response).ok());
  }
  // An id this coordinator never gave out is NOT_FOUND (register again), not PERMISSION_DENIED.
  beat.set_worker_id("worker-999999");
  {
    grpc::ClientContext context;
    Credentials(context, me);
    EXPECT_EQ(stub_->Heartbeat(&context, beat, &beat_response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(RolesTest, AWorkerMayNotReportForAnotherRank) {
  StartServer();
  const v1::RegisterWorkerResponse a = RegisterWorker("rank-a");
  const v1::RegisterWorkerResponse b = RegisterWorker("rank-b");
  v1::Job submitted;
  ASSERT_TRUE(Submit(Caller{"admin", kAdminToken, ""}, Spec("pair", 2), &submitted).ok());
  const v1::Job job = GetJob(submitted.id());
  ASSERT_EQ(job.state(), v1::RUNNING);
  const int32_t a_rank = job.worker_ids(0) == a.worker_id() ? 0 : 1;
  const Caller as_a{"worker", kWorkerToken, a.worker_secret()};
  EXPECT_TRUE(Report(as_a, a.worker_id(), job.id(), job.generation(), a_rank, 1).ok());
  EXPECT_EQ(Report(as_a, a.worker_id(), job.id(), job.generation(), 1 - a_rank, 1).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Report(as_a, b.worker_id(), job.id(), job.generation(), 1 - a_rank, 1).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(RolesTest, ProgressGoesForwardPerGenerationAndAForgedFinishIsRefused) {
  StartServer();
  const RunningJob running = StartJob("long", 1000000);
  const Caller worker{"worker", kWorkerToken, running.secret};
  const std::string& job_id = running.job.id();
  const grpc::Status forged = Report(worker, running.worker_id, job_id, 1, 0, 1, true);
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(forged.error_message(), "finished at step 1 of 1000000"))
      << forged.error_message();
  EXPECT_EQ(GetJob(job_id).state(), v1::RUNNING);
  // Even an admin cannot finish a job early: the rule holds for every caller.
  EXPECT_EQ(Report(Caller{"admin", kAdminToken, ""}, running.worker_id, job_id, 1, 0, 1, true)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  EXPECT_TRUE(Report(worker, running.worker_id, job_id, 1, 0, 10).ok());
  EXPECT_TRUE(Report(worker, running.worker_id, job_id, 1, 0, 10).ok());  // a resend
  const grpc::Status back = Report(worker, running.worker_id, job_id, 1, 0, 9);
  EXPECT_EQ(back.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(back.error_message(), "10")) << back.error_message();
  EXPECT_TRUE(absl::StrContains(back.error_message(), "9")) << back.error_message();
  EXPECT_EQ(GetJob(job_id).progress().step(), 10);
  EXPECT_EQ(Report(worker, running.worker_id, job_id, 1, 0, 1000001).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(GetJob(job_id).state(), v1::RUNNING);
}

TEST_F(RolesTest, AResumedGenerationMayStartLowerAndFinishesAtTheLastStep) {
  StartServer();
  const RunningJob first = StartJob("resumed", 50, /*max_attempts=*/2);
  const Caller worker{"worker", kWorkerToken, first.secret};
  const std::string& job_id = first.job.id();
  ASSERT_TRUE(Report(worker, first.worker_id, job_id, 1, 0, 40).ok());
  // The worker fails its run: generation 1 ends; a second worker takes generation 2.
  v1::HeartbeatRequest failed;
  failed.set_worker_id(first.worker_id);
  failed.mutable_status()->set_job_id(job_id);
  failed.mutable_status()->set_generation(1);
  failed.mutable_status()->set_run_error("the step failed");
  v1::HeartbeatResponse response;
  {
    grpc::ClientContext context;
    Credentials(context, worker);
    ASSERT_TRUE(stub_->Heartbeat(&context, failed, &response).ok());
  }
  // It has stopped that run: idle again, it takes the job's next generation.
  v1::HeartbeatRequest idle;
  idle.set_worker_id(first.worker_id);
  {
    grpc::ClientContext context;
    Credentials(context, worker);
    ASSERT_TRUE(stub_->Heartbeat(&context, idle, &response).ok());
  }
  clock_.Advance(absl::Seconds(2));
  server_->manager()->Tick();
  const v1::Job job = GetJob(job_id);
  ASSERT_EQ(job.state(), v1::RUNNING) << job.message();
  ASSERT_EQ(job.generation(), 2);
  ASSERT_EQ(job.worker_ids(0), first.worker_id);
  // Resumed from an earlier checkpoint: below generation 1's step 40.
  EXPECT_TRUE(Report(worker, first.worker_id, job_id, 2, 0, 20).ok());
  EXPECT_EQ(Report(worker, first.worker_id, job_id, 2, 0, 19).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(Report(worker, first.worker_id, job_id, 2, 0, 50, true).ok());
  EXPECT_EQ(GetJob(job_id).state(), v1::SUCCEEDED);
}

TEST_F(RolesTest, ASubmitterCancelsOnlyItsOwnJobsAndTheSubmitterSurvivesARestart) {
  StartServer();
  const Caller sam{"sam", kSubmitterToken, ""};
  const Caller sue{"sue", kOtherSubmitterToken, ""};
  v1::Job sams;
  ASSERT_TRUE(Submit(sam, Spec("sams", 1), &sams).ok());
  v1::Job sues;
  ASSERT_TRUE(Submit(sue, Spec("sues", 1), &sues).ok());
  EXPECT_EQ(sams.submitter(), "sam");
  EXPECT_EQ(sues.submitter(), "sue");

  const grpc::Status not_mine = Cancel(sam, sues.id());
  EXPECT_EQ(not_mine.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(GetJob(sues.id()).state(), v1::PENDING);

  StartServer();
  EXPECT_EQ(GetJob(sams.id()).submitter(), "sam");
  EXPECT_EQ(GetJob(sues.id()).submitter(), "sue");
  EXPECT_TRUE(Cancel(sam, sams.id()).ok());
  EXPECT_EQ(GetJob(sams.id()).state(), v1::CANCELLED);
  EXPECT_EQ(Cancel(sam, sues.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Cancel(Caller{"admin", kAdminToken, ""}, sues.id()).ok());
}

TEST_F(RolesTest, OverTlsAClientCertificateOrATokenNamesTheCaller) {
  absl::StatusOr<security::TestCertificateAuthority> ca =
      security::TestCertificateAuthority::Create(dir_, "roles-ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  absl::StatusOr<security::CertificateFiles> server_cert = ca->Issue("coordinator");
  ASSERT_TRUE(server_cert.ok()) << server_cert.status();
  absl::StatusOr<security::CertificateFiles> viewer_cert = ca->Issue("dashboard");
  ASSERT_TRUE(viewer_cert.ok()) << viewer_cert.status();
  {
    std::FILE* f = std::fopen(token_file_.c_str(), "a");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "cert:dashboard viewer dash\n");
    ASSERT_EQ(std::fclose(f), 0);
  }
  CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = -1;
  options.state_dir = dir_ + "/state";
  options.token_file = token_file_;
  options.tls.cert_file = server_cert->cert;
  options.tls.key_file = server_cert->key;
  options.tls.client_ca_file = ca->ca_cert();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options, &clock_);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = absl::StrCat("localhost:", (*server)->grpc_port());

  security::ClientTlsOptions with_cert;
  with_cert.ca_file = ca->ca_cert();
  with_cert.cert_file = viewer_cert->cert;
  with_cert.key_file = viewer_cert->key;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> cert_credentials =
      security::MakeChannelCredentials(with_cert);
  ASSERT_TRUE(cert_credentials.ok()) << cert_credentials.status();
  std::unique_ptr<v1::Coordinator::Stub> by_cert =
      v1::Coordinator::NewStub(grpc::CreateChannel(target, *cert_credentials));
  security::ClientTlsOptions server_only;
  server_only.ca_file = ca->ca_cert();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> plain_credentials =
      security::MakeChannelCredentials(server_only);
  ASSERT_TRUE(plain_credentials.ok()) << plain_credentials.status();
  std::unique_ptr<v1::Coordinator::Stub> by_token =
      v1::Coordinator::NewStub(grpc::CreateChannel(target, *plain_credentials));

  auto list_jobs = [](v1::Coordinator::Stub& stub, const Caller& caller) {
    grpc::ClientContext context;
    Credentials(context, caller);
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    return stub.ListJobs(&context, request, &response).error_code();
  };
  auto submit = [](v1::Coordinator::Stub& stub, const Caller& caller) {
    grpc::ClientContext context;
    Credentials(context, caller);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec("tls", 1);
    v1::Job job;
    return stub.SubmitJob(&context, request, &job).error_code();
  };
  const Caller certificate_only{"dashboard", "", ""};
  EXPECT_EQ(list_jobs(*by_cert, certificate_only), grpc::StatusCode::OK);
  EXPECT_EQ(submit(*by_cert, certificate_only), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(list_jobs(*by_token, certificate_only), grpc::StatusCode::UNAUTHENTICATED);
  const Caller sam{"sam", kSubmitterToken, ""};
  EXPECT_EQ(submit(*by_token, sam), grpc::StatusCode::OK);
  // A token, when sent, decides over the certificate.
  EXPECT_EQ(submit(*by_cert, sam), grpc::StatusCode::OK);
}

TEST_F(RolesTest, WithoutAuthenticationTheSubmitterIsThePeerHostAndSecretsAreIssued) {
  StartServer(/*authenticate=*/false);
  const v1::RegisterWorkerResponse worker = RegisterWorker("plain");
  EXPECT_EQ(worker.worker_secret().size(), 64u);
  v1::Job job;
  ASSERT_TRUE(Submit(Caller{"anyone", "", ""}, Spec("plain", 1), &job).ok());
  EXPECT_EQ(job.submitter(), "127.0.0.1");
}

}  // namespace
}  // namespace zeroshard::coordinator
