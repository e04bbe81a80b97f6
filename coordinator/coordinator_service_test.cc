// Service tests: an in-process CoordinatorServer on a loopback port and a real gRPC channel.
// Covers validation of every RPC, waiting StoreGets without a thread each, WatchJob, the ops
// surface (health, reflection, /metrics), leases on a fake clock, and attached jobs on their
// pinned workers.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "checkpoint/test_storage_hooks.h"
#include "common/clock.h"
#include "coordinator/request_validation.h"
#include "coordinator/test_checkpointed_job.h"
#include "coordinator/test_rpc_support.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "http/http_test_client.h"
#include "jobspec/job_plan.h"
#include "sharding/shard_planner.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using Stub = v1::Coordinator::Stub;

// `spec` running exactly `steps` steps: a rank may report finished only at its last step.
v1::JobSpec WithSteps(v1::JobSpec spec, int64_t steps) {
  spec.set_steps(steps);
  return spec;
}

int ThreadCount() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count;
}

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// Waits for the next completion-queue event and returns its ok flag (false on timeout).
bool NextOk(grpc::CompletionQueue& queue, void* expected_tag) {
  void* tag = nullptr;
  bool ok = false;
  const auto status = queue.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + kRpcDeadline));
  return status == grpc::CompletionQueue::GOT_EVENT && tag == expected_tag && ok;
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  // `checkpoint_root`: the coordinator's --checkpoint_root (none when empty).
  void StartServer(ServiceOptions service = {}, const std::string& checkpoint_root = "") {
    CoordinatorServerOptions options;
    options.manager.checkpoint_root = checkpoint_root;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = 0;
    options.state_dir =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-state");
    std::filesystem::remove_all(options.state_dir);
    options.service = service;
    if (dead_worker_retention_.has_value()) {
      options.manager.forget_gone_workers_after = *dead_worker_retention_;
    }
    options.manager.storage_hooks_for_testing = storage_hooks_;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  std::string Register(const std::string& name, const std::string& host = "host-a",
                       const std::string& attach_socket = "") {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_host(host);
    request.set_device_kind(v1::CPU);
    request.set_attach_socket(attach_socket);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.worker_id();
  }

  v1::Job Submit(const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->SubmitJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  v1::Job GetJob(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->GetJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  grpc::Status Heartbeat(const std::string& worker_id, v1::HeartbeatResponse* response,
                         absl::Duration deadline = kRpcDeadline,
                         const v1::WorkerStatus& status = {}) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    *request.mutable_status() = status;
    grpc::ClientContext context;
    SetDeadline(context, deadline);
    return stub_->Heartbeat(&context, request, response);
  }

  grpc::Status ReportProgress(const v1::Job& job, int32_t rank, int64_t step, bool finished,
                              v1::ReportProgressResponse* response) {
    v1::ReportProgressRequest request;
    request.set_worker_id(job.worker_ids(rank));
    request.set_job_id(job.id());
    request.set_generation(job.generation());
    request.set_rank(rank);
    *request.mutable_metrics() = Metrics(step);
    request.set_finished(finished);
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->ReportProgress(&context, request, response);
  }

  // Reads a WatchJob stream to its end.
  grpc::Status WatchAll(const std::string& job_id, int64_t after_sequence,
                        std::vector<v1::JobEvent>* events) {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_sequence(after_sequence);
    grpc::ClientContext context;
    SetDeadline(context);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) events->push_back(event);
    return reader->Finish();
  }

  // Registers a worker with kMaxWorkerLabels labels of the longest keys and values: the probe's
  // workers (32 labels each, about 10 KiB a WorkerInfo).
  std::string RegisterLabelled(int index) {
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("w", index));
    request.set_host(absl::StrCat("host-", index));
    request.set_device_kind(v1::CPU);
    for (int label = 0; label < kMaxWorkerLabels; ++label) {
      std::string key = absl::StrCat("label-", label, "-");
      key.resize(kMaxLabelKeyLength, 'k');
      (*request.mutable_labels())[key] = std::string(kMaxLabelValueBytes, 'v');
    }
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.worker_id();
  }

  // Lists workers page by page until the last one; every reply is checked against gRPC's default
  // 4 MiB receive limit (a bigger one would not have arrived at all) and counted in `pages`.
  grpc::Status ListAllWorkers(v1::ListWorkersRequest request, std::vector<v1::WorkerInfo>* workers,
                              int* pages) {
    *pages = 0;
    while (true) {
      v1::ListWorkersResponse response;
      grpc::ClientContext context;
      SetDeadline(context);
      const grpc::Status status = stub_->ListWorkers(&context, request, &response);
      if (!status.ok()) return status;
      ++*pages;
      EXPECT_LT(response.ByteSizeLong(), size_t{4} << 20);
      EXPECT_GT(response.workers_size(), 0);
      for (v1::WorkerInfo& worker : *response.mutable_workers()) workers->push_back(worker);
      if (response.next_page_token().empty()) return status;
      request.set_page_token(response.next_page_token());
    }
  }

  std::vector<std::string> Ids(const std::vector<v1::WorkerInfo>& workers) {
    std::vector<std::string> ids;
    for (const v1::WorkerInfo& worker : workers) ids.push_back(worker.id());
    return ids;
  }

  common::FakeClock clock_;
  // When set, the coordinator's --dead_worker_retention.
  std::optional<absl::Duration> dead_worker_retention_;
  // Sees (and may hold) the coordinator's checkpoint storage operations; none when null.
  std::shared_ptr<checkpoint::StorageHooks> storage_hooks_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

// ---- Bad input ----

// One malformed request: the call, the code it must get and the field its message must name
// (the message starts with "<field>:").
struct BadRequest {
  std::string what;
  grpc::StatusCode code;
  std::string field;
  std::function<grpc::Status(Stub&, grpc::ClientContext&)> call;
};

template <typename Request, typename Response>
using StubMethod = grpc::Status (Stub::*)(grpc::ClientContext*, const Request&, Response*);

template <typename Request, typename Response>
BadRequest Bad(std::string what, grpc::StatusCode code, std::string field,
               StubMethod<Request, Response> method, Request request) {
  return {std::move(what), code, std::move(field),
          [method, request](Stub& stub, grpc::ClientContext& context) {
            Response response;
            return (stub.*method)(&context, request, &response);
          }};
}

BadRequest BadSpec(std::string what, std::string field, std::function<void(v1::JobSpec&)> edit) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec("bad-job", 1);
  edit(*request.mutable_spec());
  return Bad(std::move(what), grpc::StatusCode::INVALID_ARGUMENT, std::move(field),
             &Stub::SubmitJob, request);
}

TEST_F(CoordinatorServiceTest, EveryMalformedRequestIsRefusedAndChangesNothing) {
  StartServer();
  // A job in its second generation: worker a ran generation 1 and left; worker b runs 2.
  const std::string worker_a = Register("worker-a");
  const v1::Job first = Submit(Spec("alpha", 1));
  ASSERT_EQ(GetJob(first.id()).state(), v1::RUNNING);
  {
    v1::LeaveWorkerRequest request;
    request.set_worker_id(worker_a);
    v1::LeaveWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->LeaveWorker(&context, request, &response).ok());
  }
  const std::string worker_b = Register("worker-b");
  const v1::Job job = GetJob(first.id());
  ASSERT_EQ(job.state(), v1::RUNNING);
  ASSERT_EQ(job.generation(), 2);
  ASSERT_EQ(job.worker_ids(0), worker_b);

  v1::RegisterWorkerRequest worker;
  worker.set_name("worker-c");
  worker.set_host("host-c");
  worker.set_device_kind(v1::CPU);
  v1::ReportProgressRequest progress;
  progress.set_worker_id(worker_b);
  progress.set_job_id(job.id());
  progress.set_generation(2);
  *progress.mutable_metrics() = Metrics(1);
  v1::CommitCheckpointRequest commit;
  commit.set_worker_id(worker_b);
  commit.set_job_id(job.id());
  commit.set_generation(2);
  commit.set_step(1);
  commit.set_path("alpha/step-1/rank-0");
  commit.set_bytes(10);
  v1::StoreSetRequest store_set;
  store_set.set_job_id(job.id());
  store_set.set_generation(2);
  store_set.set_key("k");
  v1::StoreGetRequest store_get;
  store_get.set_job_id(job.id());
  store_get.set_generation(2);
  store_get.set_key("k");

  using Code = grpc::StatusCode;
  const Code kInvalid = Code::INVALID_ARGUMENT;
  std::vector<BadRequest> table;
  auto add = [&](BadRequest row) { table.push_back(std::move(row)); };
  auto edited = [](auto request, auto edit) {
    edit(request);
    return request;
  };

  // RegisterWorker.
  add(Bad("empty worker name", kInvalid, "name", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { r.set_name(""); })));
  add(Bad("worker name outside [a-z0-9-]", kInvalid, "name", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { r.set_name("Worker_C"); })));
  add(Bad("empty host", kInvalid, "host", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { r.set_host(""); })));
  add(Bad("unknown device kind", kInvalid, "device_kind", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { r.set_device_kind(static_cast<v1::DeviceKind>(7)); })));
  add(Bad("negative device memory", kInvalid, "device_memory_bytes", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { r.set_device_memory_bytes(-1); })));
  add(Bad("label key with spaces", kInvalid, "labels", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { (*r.mutable_labels())["Bad Key"] = "x"; })));
  add(Bad("relative attach socket", kInvalid, "attach_socket", &Stub::RegisterWorker,
          edited(worker, [](auto& r) { r.set_attach_socket("w.sock"); })));
  // Heartbeat.
  v1::HeartbeatRequest heartbeat;
  add(Bad("heartbeat without worker id", kInvalid, "worker_id", &Stub::Heartbeat, heartbeat));
  heartbeat.set_worker_id("w1");
  add(Bad("malformed worker id", kInvalid, "worker_id", &Stub::Heartbeat, heartbeat));
  heartbeat.set_worker_id(worker_b);
  heartbeat.mutable_status()->set_generation(-1);
  add(Bad("negative status generation", kInvalid, "status.generation", &Stub::Heartbeat,
          heartbeat));
  heartbeat.clear_status();
  heartbeat.set_worker_id("worker-999999");
  add(Bad("heartbeat from an unknown worker", Code::NOT_FOUND, "worker_id", &Stub::Heartbeat,
          heartbeat));
  heartbeat.set_worker_id(worker_a);
  add(Bad("heartbeat from a departed worker", Code::NOT_FOUND, "worker_id", &Stub::Heartbeat,
          heartbeat));
  // LeaveWorker, ListWorkers.
  v1::LeaveWorkerRequest leave;
  leave.set_worker_id("nobody");
  add(Bad("leave with a malformed id", kInvalid, "worker_id", &Stub::LeaveWorker, leave));
  leave.set_worker_id("worker-999999");
  add(Bad("leave of an unknown worker", Code::NOT_FOUND, "worker_id", &Stub::LeaveWorker, leave));
  v1::ListWorkersRequest list_workers;
  list_workers.set_state(static_cast<v1::WorkerState>(99));
  add(Bad("unknown worker state filter", kInvalid, "state", &Stub::ListWorkers, list_workers));
  // SubmitJob.
  add(Bad("submit without a spec", kInvalid, "spec", &Stub::SubmitJob, v1::SubmitJobRequest()));
  add(BadSpec("NaN learning rate", "spec.optimizer.lr", [](v1::JobSpec& s) {
    s.mutable_optimizer()->set_lr(std::numeric_limits<double>::quiet_NaN());
  }));
  add(BadSpec("negative learning rate", "spec.optimizer.lr",
              [](v1::JobSpec& s) { s.mutable_optimizer()->set_lr(-0.1); }));
  add(BadSpec("infinite weight decay", "spec.optimizer.weight_decay", [](v1::JobSpec& s) {
    s.mutable_optimizer()->set_weight_decay(std::numeric_limits<double>::infinity());
  }));
  add(BadSpec("unknown preset", "spec.workload.preset",
              [](v1::JobSpec& s) { s.mutable_workload()->set_preset("gigantic"); }));
  add(BadSpec("preset and layer sizes both set", "spec.workload",
              [](v1::JobSpec& s) { s.mutable_workload()->add_layer_sizes(10); }));
  add(BadSpec("unknown optimizer kind", "spec.optimizer.kind", [](v1::JobSpec& s) {
    s.mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(42));
  }));
  add(BadSpec("gather pool outside zero3", "spec.gather_pool_buckets", [](v1::JobSpec& s) {
    s.set_mode(v1::ZERO1);
    s.set_gather_pool_buckets(2);
  }));
  add(BadSpec("world size 0", "spec.min_workers", [](v1::JobSpec& s) { s.set_min_workers(0); }));
  add(BadSpec("max_workers below min_workers", "spec.max_workers", [](v1::JobSpec& s) {
    s.set_min_workers(4);
    s.set_max_workers(2);
  }));
  add(BadSpec("world size beyond the limit", "spec.min_workers", [](v1::JobSpec& s) {
    s.set_min_workers(100000);
    s.set_max_workers(100000);
  }));
  add(BadSpec("job name with capitals", "spec.name", [](v1::JobSpec& s) { s.set_name("My Job"); }));
  add(BadSpec("bucket_elems below the minimum", "spec.bucket_elems",
              [](v1::JobSpec& s) { s.set_bucket_elems(10); }));
  add(BadSpec("bucket_elems above the maximum", "spec.bucket_elems",
              [](v1::JobSpec& s) { s.set_bucket_elems(int64_t{1} << 40); }));
  add(BadSpec("global batch no world size divides", "spec.global_batch", [](v1::JobSpec& s) {
    s.set_min_workers(2);
    s.set_max_workers(2);
    s.set_global_batch(7);
  }));
  add(BadSpec("zero steps", "spec.steps", [](v1::JobSpec& s) { s.set_steps(0); }));
  add(BadSpec("checkpoint dir escaping the root", "spec.checkpoint.dir",
              [](v1::JobSpec& s) { s.mutable_checkpoint()->set_dir("../elsewhere"); }));
  add(BadSpec("unknown device kind in the spec", "spec.device_kind",
              [](v1::JobSpec& s) { s.set_device_kind(static_cast<v1::DeviceKind>(9)); }));
  add(BadSpec("attached model and a preset", "spec.workload.attached", [](v1::JobSpec& s) {
    s.mutable_workload()->mutable_attached()->add_workers("worker-a");
  }));
  // GetJob, ListJobs, CancelJob, WatchJob, GetShardPlan.
  v1::GetJobRequest get_job;
  add(Bad("GetJob without id", kInvalid, "job_id", &Stub::GetJob, get_job));
  get_job.set_job_id("job-999999");
  add(Bad("GetJob of an unknown job", Code::NOT_FOUND, "job_id", &Stub::GetJob, get_job));
  v1::ListJobsRequest list_jobs;
  list_jobs.set_limit(0);
  add(Bad("ListJobs limit 0", kInvalid, "limit", &Stub::ListJobs, list_jobs));
  list_jobs.set_limit(1001);
  add(Bad("ListJobs limit above 1000", kInvalid, "limit", &Stub::ListJobs, list_jobs));
  list_jobs.clear_limit();
  list_jobs.set_state(static_cast<v1::JobState>(77));
  add(Bad("unknown job state filter", kInvalid, "state", &Stub::ListJobs, list_jobs));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  cancel.set_reason(std::string(2000, 'r'));
  add(Bad("cancel reason too long", kInvalid, "reason", &Stub::CancelJob, cancel));
  cancel.set_job_id("job-999999");
  cancel.clear_reason();
  add(Bad("cancel of an unknown job", Code::NOT_FOUND, "job_id", &Stub::CancelJob, cancel));
  for (const auto& [what, job_id, after, code, field] :
       std::vector<std::tuple<std::string, std::string, int64_t, Code, std::string>>{
           {"watch with a negative after_sequence", job.id(), -1, kInvalid, "after_sequence"},
           {"watch of an unknown job", "job-999999", 0, Code::NOT_FOUND, "job_id"},
           {"watch with a malformed job id", "job_1", 0, kInvalid, "job_id"}}) {
    v1::WatchJobRequest watch;
    watch.set_job_id(job_id);
    watch.set_after_sequence(after);
    add({what, code, field, [watch](Stub& stub, grpc::ClientContext& context) {
           std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
               stub.WatchJob(&context, watch);
           v1::JobEvent event;
           while (reader->Read(&event)) {
           }
           return reader->Finish();
         }});
  }
  v1::GetShardPlanRequest plan;
  plan.set_job_id(job.id());
  plan.set_rank(-1);
  add(Bad("negative plan rank", kInvalid, "rank", &Stub::GetShardPlan, plan));
  plan.set_rank(3);
  add(Bad("plan rank beyond the world size", kInvalid, "rank", &Stub::GetShardPlan, plan));
  plan.set_rank(0);
  plan.set_generation(1);
  add(Bad("plan of an ended generation", Code::FAILED_PRECONDITION, "generation",
          &Stub::GetShardPlan, plan));
  // Store calls.
  add(Bad("store set on generation 0", kInvalid, "generation", &Stub::StoreSet,
          edited(store_set, [](auto& r) { r.set_generation(0); })));
  add(Bad("store set on a stale generation", Code::FAILED_PRECONDITION, "generation",
          &Stub::StoreSet, edited(store_set, [](auto& r) { r.set_generation(1); })));
  add(Bad("store set on a generation not started", Code::FAILED_PRECONDITION, "generation",
          &Stub::StoreSet, edited(store_set, [](auto& r) { r.set_generation(3); })));
  add(Bad("store set on a job without namespace", Code::NOT_FOUND, "job_id", &Stub::StoreSet,
          edited(store_set, [](auto& r) { r.set_job_id("job-000777"); })));
  add(Bad("store key too long", kInvalid, "key", &Stub::StoreSet,
          edited(store_set, [](auto& r) { r.set_key(std::string(513, 'k')); })));
  add(Bad("store value too big", kInvalid, "value", &Stub::StoreSet,
          edited(store_set, [](auto& r) { r.set_value(std::string((1 << 20) + 1, 'v')); })));
  add(Bad("store get timeout above 10 minutes", kInvalid, "timeout_ms", &Stub::StoreGet,
          edited(store_get, [](auto& r) { r.set_timeout_ms(600001); })));
  add(Bad("store get negative timeout", kInvalid, "timeout_ms", &Stub::StoreGet,
          edited(store_get, [](auto& r) { r.set_timeout_ms(-1); })));
  add(Bad("store get of a stale generation", Code::FAILED_PRECONDITION, "generation",
          &Stub::StoreGet, edited(store_get, [](auto& r) { r.set_generation(1); })));
  v1::StoreAddRequest store_add;
  store_add.set_job_id(job.id());
  store_add.set_generation(2);
  add(Bad("store add without key", kInvalid, "key", &Stub::StoreAdd, store_add));
  v1::StoreDeleteRequest store_delete;
  store_delete.set_job_id("JOB-1");
  store_delete.set_generation(2);
  store_delete.set_key("k");
  add(Bad("store delete with a malformed job id", kInvalid, "job_id", &Stub::StoreDelete,
          store_delete));
  // ReportProgress.
  add(Bad("NaN loss", kInvalid, "metrics.loss", &Stub::ReportProgress,
          edited(progress, [](auto& r) {
            r.mutable_metrics()->set_loss(std::numeric_limits<double>::quiet_NaN());
          })));
  add(Bad("infinite step time", kInvalid, "metrics.step_ms", &Stub::ReportProgress,
          edited(progress, [](auto& r) {
            r.mutable_metrics()->set_step_ms(std::numeric_limits<double>::infinity());
          })));
  add(Bad("zero loss scale", kInvalid, "metrics.loss_scale", &Stub::ReportProgress,
          edited(progress, [](auto& r) { r.mutable_metrics()->set_loss_scale(0); })));
  add(Bad("progress without metrics", kInvalid, "metrics", &Stub::ReportProgress,
          edited(progress, [](auto& r) { r.clear_metrics(); })));
  add(Bad("progress for a rank the worker does not hold", Code::PERMISSION_DENIED, "worker_id",
          &Stub::ReportProgress, edited(progress, [&](auto& r) { r.set_worker_id(worker_a); })));
  add(Bad("progress for a rank beyond the world size", kInvalid, "rank", &Stub::ReportProgress,
          edited(progress, [](auto& r) { r.set_rank(1); })));
  // CommitCheckpoint.
  add(Bad("checkpoint path with ..", kInvalid, "path", &Stub::CommitCheckpoint,
          edited(commit, [](auto& r) { r.set_path("alpha/../../etc/passwd"); })));
  add(Bad("absolute checkpoint path", kInvalid, "path", &Stub::CommitCheckpoint,
          edited(commit, [](auto& r) { r.set_path("/etc/passwd"); })));
  add(Bad("negative checkpoint size", kInvalid, "bytes", &Stub::CommitCheckpoint,
          edited(commit, [](auto& r) { r.set_bytes(-1); })));
  ASSERT_GE(table.size(), 30u);

  auto snapshot = [&] {
    v1::ListJobsResponse jobs;
    v1::ListWorkersResponse workers;
    grpc::ClientContext jobs_context, workers_context;
    SetDeadline(jobs_context);
    SetDeadline(workers_context);
    EXPECT_TRUE(stub_->ListJobs(&jobs_context, v1::ListJobsRequest(), &jobs).ok());
    EXPECT_TRUE(stub_->ListWorkers(&workers_context, v1::ListWorkersRequest(), &workers).ok());
    return std::make_pair(jobs, workers);
  };
  const auto before = snapshot();

  for (const BadRequest& row : table) {
    SCOPED_TRACE(row.what);
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = row.call(*stub_, context);
    EXPECT_EQ(status.error_code(), row.code) << status.error_message();
    EXPECT_TRUE(absl::StartsWith(status.error_message(), row.field + ":"))
        << "message does not name " << row.field << ": " << status.error_message();
  }

  const auto after = snapshot();
  EXPECT_TRUE(MessageDifferencer::Equals(before.first, after.first))
      << before.first.DebugString() << "\nvs\n"
      << after.first.DebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(before.second, after.second));
  ASSERT_EQ(after.first.jobs_size(), 1);

  // Still serving: a valid submission succeeds and is the only new job.
  const v1::Job second = Submit(Spec("beta", 2));
  EXPECT_EQ(second.state(), v1::PENDING);
  v1::ListJobsResponse jobs;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 2);
  EXPECT_EQ(jobs.jobs(0).id(), second.id());
  EXPECT_EQ(jobs.jobs(1).id(), job.id());
}

// ---- Attached jobs ----

// A trainer's model: tensors in gradient-ready order, ranks pinned to workers by name.
v1::JobSpec AttachedSpec(const std::vector<std::string>& workers) {
  v1::JobSpec spec;
  spec.set_name("torch-train");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  v1::AttachedModel& attached = *spec.mutable_workload()->mutable_attached();
  const std::pair<const char*, std::vector<int64_t>> tensors[] = {
      {"head.bias", {10}}, {"head.weight", {10, 32}}, {"scale", {}}, {"embed.weight", {100, 32}}};
  for (const auto& [name, shape] : tensors) {
    v1::AttachedTensor& tensor = *attached.add_tensors();
    tensor.set_name(name);
    for (int64_t dim : shape) tensor.add_shape(dim);
  }
  for (const std::string& worker : workers) attached.add_workers(worker);
  return spec;
}

TEST_F(CoordinatorServiceTest, AttachedJobRunsOnItsPinnedWorkersWithTheirSockets) {
  StartServer();
  // The coordinator only passes the paths on (bazel's TEST_TMPDIR is longer than a socket path
  // may be).
  const std::string socket_dir = "/tmp/zeroshard-attach";
  const std::string first = Register("trainer-host-0", "host-a", socket_dir + "/w0.sock");
  const std::string second = Register("trainer-host-1", "host-b", socket_dir + "/w1.sock");
  // Pinned in the reverse order of registration (and of hosts).
  const v1::JobSpec spec = AttachedSpec({"trainer-host-1", "trainer-host-0"});
  const v1::Job submitted = Submit(spec);
  ASSERT_FALSE(submitted.id().empty());
  EXPECT_EQ(submitted.spec().steps(), 0);
  EXPECT_FALSE(submitted.spec().has_global_batch());
  EXPECT_EQ(submitted.spec().min_workers(), 2);
  EXPECT_EQ(submitted.spec().max_workers(), 2);

  const std::string by_rank[] = {second, first};
  const std::string socket_by_rank[] = {socket_dir + "/w1.sock", socket_dir + "/w0.sock"};
  for (int rank : {1, 0}) {
    v1::HeartbeatResponse response;
    const grpc::Status status = Heartbeat(by_rank[rank], &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    const v1::Assignment& assignment = response.assignment();
    EXPECT_EQ(assignment.kind(), v1::ASSIGNMENT_RUN) << "rank " << rank;
    EXPECT_EQ(assignment.job_id(), submitted.id());
    EXPECT_EQ(assignment.rank(), rank);
    EXPECT_EQ(assignment.world_size(), 2);
    EXPECT_EQ(assignment.attach_socket(), socket_by_rank[rank]);
    EXPECT_TRUE(assignment.spec().workload().has_attached());
  }
  const v1::Job job = GetJob(submitted.id());
  ASSERT_EQ(job.state(), v1::RUNNING) << job.message();
  ASSERT_EQ(job.worker_ids_size(), 2);
  EXPECT_EQ(job.worker_ids(0), second);
  EXPECT_EQ(job.worker_ids(1), first);

  // The plan lists the spec's tensors, in its order, with their shapes.
  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(job.id());
  plan_request.set_include_layout(true);
  v1::ShardPlan plan;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->GetShardPlan(&context, plan_request, &plan);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const v1::AttachedModel& attached = spec.workload().attached();
  ASSERT_EQ(plan.tensors_size(), attached.tensors_size());
  int64_t elements = 0;
  for (int t = 0; t < plan.tensors_size(); ++t) {
    EXPECT_EQ(plan.tensors(t).name(), attached.tensors(t).name());
    EXPECT_TRUE(std::equal(plan.tensors(t).shape().begin(), plan.tensors(t).shape().end(),
                           attached.tensors(t).shape().begin(), attached.tensors(t).shape().end()))
        << plan.tensors(t).name();
    elements += plan.tensors(t).elements();
  }
  EXPECT_EQ(elements, 10 + 10 * 32 + 1 + 100 * 32);
  EXPECT_EQ(plan.model_elems(), elements);
  // It carries the ZeRO formula of the job's mode at its W (jobspec::ModelStateFormulaForJob).
  const v1::ModelStateFormula expected_formula =
      jobspec::ModelStateFormulaForJob(job.spec(), plan.world_size(), plan.model_elems());
  EXPECT_EQ(plan.model_state_formula().SerializeAsString(), expected_formula.SerializeAsString());
  EXPECT_EQ(plan.model_state_formula().parameters(), elements);

  // ListWorkers shows each worker's socket.
  {
    v1::ListWorkersResponse workers;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok());
    ASSERT_EQ(workers.workers_size(), 2);
    EXPECT_EQ(workers.workers(0).attach_socket(), socket_dir + "/w0.sock");
    EXPECT_EQ(workers.workers(1).attach_socket(), socket_dir + "/w1.sock");
  }

  // It ends when every rank reported finished, whatever its step.
  v1::ReportProgressResponse progress;
  ASSERT_TRUE(ReportProgress(job, 0, 37, false, &progress).ok());
  EXPECT_TRUE(progress.continue_running());
  ASSERT_TRUE(ReportProgress(job, 1, 37, true, &progress).ok());
  ASSERT_TRUE(ReportProgress(job, 0, 37, true, &progress).ok());
  const v1::Job done = GetJob(job.id());
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 37);
}

TEST_F(CoordinatorServiceTest, BadAttachedSpecsAreRefusedNamingTheField) {
  StartServer();
  struct Case {
    std::string field;
    std::function<void(v1::JobSpec&)> edit;
  };
  const Case cases[] = {
      {"spec.workload.attached", [](v1::JobSpec& s) { s.mutable_workload()->set_preset("seed"); }},
      {"spec.workload.attached.tensors",
       [](v1::JobSpec& s) { s.mutable_workload()->mutable_attached()->clear_tensors(); }},
      {"spec.workload.attached.tensors[1].shape[1]",
       [](v1::JobSpec& s) {
         s.mutable_workload()->mutable_attached()->mutable_tensors(1)->set_shape(1, 0);
       }},
      {"spec.workload.attached.tensors[3].name",
       [](v1::JobSpec& s) {
         s.mutable_workload()->mutable_attached()->mutable_tensors(3)->set_name("head.bias");
       }},
      {"spec.workload.attached.workers",
       [](v1::JobSpec& s) { s.mutable_workload()->mutable_attached()->clear_workers(); }},
      {"spec.workload.attached.workers[1]",
       [](v1::JobSpec& s) { s.mutable_workload()->mutable_attached()->set_workers(1, "node-a"); }},
      {"spec.precision.param_dtype",
       [](v1::JobSpec& s) { s.mutable_precision()->set_param_dtype(v1::BFLOAT16); }},
      {"spec.min_workers", [](v1::JobSpec& s) { s.set_min_workers(1); }},
      {"spec.steps", [](v1::JobSpec& s) { s.set_steps(100); }},
      {"spec.global_batch", [](v1::JobSpec& s) { s.set_global_batch(64); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = AttachedSpec({"node-a", "node-b"});
    c.edit(*request.mutable_spec());
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->SubmitJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_TRUE(absl::StartsWith(status.error_message(), c.field + ": ")) << status.error_message();
  }
  v1::ListJobsResponse jobs;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

TEST_F(CoordinatorServiceTest, OversizedMessageIsResourceExhausted) {
  StartServer();
  v1::StoreSetRequest request;
  request.set_job_id("job-000001");
  request.set_generation(1);
  request.set_key("k");
  request.set_value(std::string(5 << 20, 'v'));
  v1::StoreSetResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status status = stub_->StoreSet(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // The server still serves.
  Register("after-oversized");
}

// Calls a unary Coordinator method with `request` as the raw request bytes.
grpc::Status CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& request) {
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call = generic.PrepareUnaryCall(
      &context, absl::StrCat("/zeroshard.v1.Coordinator/", method), ToByteBuffer(request), &queue);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status(grpc::StatusCode::UNKNOWN, "no reply before the deadline");
  call->Finish(&response, &status, &call);
  EXPECT_TRUE(NextOk(queue, &call));
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

// A length-delimited field: tag, one-byte length, bytes (shorter than 128 bytes).
std::string LengthDelimitedField(int number, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>(number << 3 | 2));
  out.push_back(static_cast<char>(value.size()));
  return out + value;
}

TEST_F(CoordinatorServiceTest, UnparseableUnaryRequestsAreInvalidArgumentWithAReason) {
  StartServer();
  // Field 15 with wire type 7, which does not exist.
  const std::string garbage = "\x7f\xff\xff not protobuf";
  for (const char* method :
       {"RegisterWorker", "Heartbeat", "LeaveWorker", "ListWorkers", "SubmitJob", "GetJob",
        "ListJobs", "CancelJob", "GetShardPlan", "StoreSet", "StoreGet", "StoreAdd", "StoreDelete",
        "ReportProgress", "CommitCheckpoint", "RewindJob", "VerifyCheckpoint"}) {
    const grpc::Status status = CallRaw(channel_, method, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(status.error_message(),
              absl::StrCat("request: not a valid zeroshard.v1.", method,
                           "Request: the bytes are not protobuf wire format"))
        << method;
  }

  const v1::Job job = Submit(Spec("utf8-victim", 1));
  const std::string bad_reason =
      LengthDelimitedField(1, job.id()) + LengthDelimitedField(2, "stop \xc3\x28 now");
  grpc::Status status = CallRaw(channel_, "CancelJob", bad_reason);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "request: not a valid zeroshard.v1.CancelJobRequest: reason: holds invalid UTF-8 "
            "(string fields must be UTF-8)");
  EXPECT_EQ(GetJob(job.id()).state(), v1::PENDING);

  // A parked StoreGet is parsed on a path of its own.
  const std::string bad_key =
      LengthDelimitedField(1, job.id()) + "\x10\x01" + LengthDelimitedField(3, "\xff\xfe");
  status = CallRaw(channel_, "StoreGet", bad_key);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(
      absl::StrContains(status.error_message(), "StoreGetRequest: key: holds invalid UTF-8"))
      << status.error_message();

  // A well-formed request through the same raw path still works.
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  EXPECT_TRUE(CallRaw(channel_, "GetJob", get.SerializeAsString()).ok());
}

// The streaming methods are registered raw too: their unparseable requests end the stream with
// INVALID_ARGUMENT and the reason, before any message is written.
TEST_F(CoordinatorServiceTest, UnparseableStreamingRequestsAreInvalidArgumentWithAReason) {
  StartServer();
  const std::string bad_job_id = LengthDelimitedField(1, "job-\xc3\x28");
  struct Case {
    const char* method;
    std::string request;
    std::string message;
  };
  const Case cases[] = {
      {"WatchJob", "\x7f\xff\xff not protobuf",
       "request: not a valid zeroshard.v1.WatchJobRequest: the bytes are not protobuf wire format"},
      {"ExportCheckpoint", "\x7f\xff\xff not protobuf",
       "request: not a valid zeroshard.v1.ExportCheckpointRequest: the bytes are not protobuf "
       "wire format"},
      {"WatchJob", bad_job_id,
       "request: not a valid zeroshard.v1.WatchJobRequest: job_id: holds invalid UTF-8 (string "
       "fields must be UTF-8)"},
      {"ExportCheckpoint", bad_job_id,
       "request: not a valid zeroshard.v1.ExportCheckpointRequest: job_id: holds invalid UTF-8 "
       "(string fields must be UTF-8)"},
  };
  for (const Case& c : cases) {
    const char* method = c.method;
    grpc::GenericStub generic(channel_);
    grpc::CompletionQueue queue;
    grpc::ClientContext context;
    SetDeadline(context);
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic.PrepareCall(&context, absl::StrCat("/zeroshard.v1.Coordinator/", method), &queue);
    int start_tag, write_tag, read_tag, finish_tag;
    call->StartCall(&start_tag);
    ASSERT_TRUE(NextOk(queue, &start_tag));
    call->WriteLast(ToByteBuffer(c.request), grpc::WriteOptions(), &write_tag);
    NextOk(queue, &write_tag);
    grpc::ByteBuffer response;
    call->Read(&response, &read_tag);
    EXPECT_FALSE(NextOk(queue, &read_tag)) << method;
    grpc::Status status;
    call->Finish(&status, &finish_tag);
    ASSERT_TRUE(NextOk(queue, &finish_tag));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(status.error_message(), c.message) << method;
    queue.Shutdown();
    void* tag;
    bool ok;
    while (queue.Next(&tag, &ok)) {
    }
  }
}

// Fails before the fix: ZERO3 was refused at submission, and the plan's formula had no pool.
TEST_F(CoordinatorServiceTest, Zero3JobsPlanShardsTheParametersAndCarriesThePool) {
  StartServer();
  const std::string workers[] = {Register("zero3-a"), Register("zero3-b")};
  v1::JobSpec spec = Spec("zero3", 2);
  spec.mutable_workload()->clear_preset();
  for (int size : {64, 64, 64}) spec.mutable_workload()->add_layer_sizes(size);
  spec.set_mode(v1::ZERO3);
  spec.set_bucket_elems(1024);

  // A pool that cannot hold one module's buckets is refused at submission, naming both numbers.
  v1::JobSpec too_small = spec;
  too_small.set_gather_pool_buckets(1);
  {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = too_small;
    v1::Job refused;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->SubmitJob(&context, request, &refused);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_TRUE(
        absl::StrContains(status.error_message(),
                          "gather_pool_buckets: 1 is below the most buckets one module spans"))
        << status.error_message();
  }

  const v1::Job submitted = Submit(spec);
  ASSERT_FALSE(submitted.id().empty());
  for (const std::string& worker : workers) {
    v1::HeartbeatResponse response;
    ASSERT_TRUE(Heartbeat(worker, &response).ok());
  }
  const v1::Job job = GetJob(submitted.id());
  ASSERT_EQ(job.state(), v1::RUNNING) << job.message();
  v1::GetShardPlanRequest plan_request;
  plan_request.set_job_id(job.id());
  v1::ShardPlan plan;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->GetShardPlan(&context, plan_request, &plan);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const v1::ModelStateFormula& formula = plan.model_state_formula();
  EXPECT_EQ(formula.params_bytes(), 4.0 * plan.model_elems() / 2);  // sharded over W = 2
  absl::StatusOr<sharding::ShardPlan> full = jobspec::PlanForJob(job.spec(), 2);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_GT(formula.gather_pool_bytes(), 0);
  EXPECT_EQ(formula.gather_pool_bytes(), jobspec::GatherPoolBytesForJob(job.spec(), *full));
}

TEST_F(CoordinatorServiceTest, ALongPresetIsRefusedNamingItInAShortMessage) {
  StartServer();
  for (const size_t length : {size_t{65}, size_t{16} << 10, size_t{1} << 20}) {
    v1::JobSpec spec = Spec("long-preset", 1);
    spec.mutable_workload()->set_preset(std::string(length, 'p'));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->SubmitJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << length;
    EXPECT_TRUE(absl::StartsWith(status.error_message(), "spec.workload.preset: "))
        << status.error_message();
    EXPECT_LT(status.error_message().size(), 200u) << status.error_message();
  }
}

TEST_F(CoordinatorServiceTest, ACancelReasonWithNewlinesIsLoggedOnOneEscapedLine) {
  StartServer();
  const v1::Job job = Submit(Spec("log-victim", 1));
  const std::string forged = "E1130 12:00:00.000000 job_manager.cc:1] FAKE";
  v1::CancelJobRequest request;
  request.set_job_id(job.id());
  request.set_reason("bye\n" + forged + "\r\n");
  v1::Job cancelled;
  grpc::ClientContext context;
  SetDeadline(context);
  ::testing::internal::CaptureStderr();
  const grpc::Status status = stub_->CancelJob(&context, request, &cancelled);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
  // The reason is stored as given; only the log line escapes it.
  EXPECT_EQ(cancelled.message(), "cancelled: " + request.reason());
  const std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
  int reason_lines = 0;
  for (const std::string& line : lines) {
    EXPECT_FALSE(absl::StartsWith(line, "E1130 12:00:00")) << log;
    if (absl::StrContains(line, "FAKE")) {
      ++reason_lines;
      EXPECT_TRUE(absl::StrContains(line, "cancelled: bye\\n" + forged + "\\r\\n")) << line;
    }
  }
  EXPECT_EQ(reason_lines, 1) << log;
}

// ---- Rendezvous waits ----

TEST_F(CoordinatorServiceTest, ThousandWaitingGetsHoldNoThreadsAndOneSetReleasesThem) {
  StartServer();
  const std::string worker = Register("waiter-host");
  const v1::Job job = GetJob(Submit(Spec("gather", 1)).id());
  ASSERT_EQ(job.state(), v1::RUNNING);

  constexpr int kWaiters = 1000;
  constexpr int kChannels = 4;
  struct Wait {
    grpc::ClientContext context;
    v1::StoreGetRequest request;
    v1::StoreGetResponse response;
  };
  std::vector<std::unique_ptr<Stub>> stubs;
  for (int i = 0; i < kChannels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("zeroshard.test_channel", i);  // distinct channels, distinct connections
    stubs.push_back(v1::Coordinator::NewStub(grpc::CreateCustomChannel(
        server_->grpc_target(), grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<Wait>> waits;
  absl::Mutex mu;
  int done = 0;
  int released_with_value = 0;
  std::vector<std::string> failures;
  for (int i = 0; i < kWaiters; ++i) {
    auto wait = std::make_unique<Wait>();
    SetDeadline(wait->context, absl::Seconds(60));
    wait->request.set_job_id(job.id());
    wait->request.set_generation(job.generation());
    wait->request.set_key("rendezvous");
    wait->request.set_timeout_ms(600000);
    Wait* raw = wait.get();
    stubs[i % kChannels]->async()->StoreGet(
        &raw->context, &raw->request, &raw->response, [&, raw](grpc::Status status) {
          absl::MutexLock lock(&mu);
          ++done;
          if (status.ok() && raw->response.value() == "ready") {
            ++released_with_value;
          } else if (failures.size() < 5) {
            failures.push_back(absl::StrCat(status.error_code(), " ", status.error_message()));
          }
        });
    waits.push_back(std::move(wait));
  }

  const bool all_parked = server_->rendezvous()->AwaitPendingWaiters(kWaiters, absl::Seconds(20)) &&
                          server_->rendezvous()->PendingWaiters() == kWaiters;
  EXPECT_TRUE(all_parked) << server_->rendezvous()->PendingWaiters() << " waiting";
  if (all_parked) {
    EXPECT_LT(ThreadCount(), 64);
    {
      absl::MutexLock lock(&mu);
      EXPECT_EQ(done, 0);
    }
    // Other calls are answered while the Gets wait.
    for (int i = 0; i < 5; ++i) {
      v1::HeartbeatResponse heartbeat;
      const grpc::Status status = Heartbeat(worker, &heartbeat, absl::Seconds(2));
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(heartbeat.assignment().kind(), v1::ASSIGNMENT_RUN);
      v1::GetJobRequest request;
      request.set_job_id(job.id());
      v1::Job got;
      grpc::ClientContext context;
      SetDeadline(context, absl::Seconds(2));
      EXPECT_TRUE(stub_->GetJob(&context, request, &got).ok());
    }
    EXPECT_LT(ThreadCount(), 64);

    v1::StoreSetRequest set;
    set.set_job_id(job.id());
    set.set_generation(job.generation());
    set.set_key("rendezvous");
    set.set_value("ready");
    v1::StoreSetResponse set_response;
    grpc::ClientContext context;
    SetDeadline(context);
    EXPECT_TRUE(stub_->StoreSet(&context, set, &set_response).ok());
  }

  absl::MutexLock lock(&mu);
  auto all_done = [&done] { return done == kWaiters; };
  mu.AwaitWithDeadline(absl::Condition(&all_done), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(done, kWaiters);
  EXPECT_EQ(released_with_value, kWaiters);
  EXPECT_TRUE(failures.empty()) << failures.front();
  // Calls still pending after a failure must end before their contexts go away.
  if (done < kWaiters) {
    for (const std::unique_ptr<Wait>& wait : waits) wait->context.TryCancel();
    mu.Await(absl::Condition(&all_done));
  }
}

// ---- WatchJob ----

TEST_F(CoordinatorServiceTest, WatchStreamsHistoryThenLiveEventsToCompletion) {
  StartServer();
  Register("rank-a", "host-a");
  Register("rank-b", "host-b");
  const v1::Job job = GetJob(Submit(WithSteps(Spec("watched", 2), 2)).id());
  ASSERT_EQ(job.state(), v1::RUNNING);

  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  // History: submitted (PENDING), generation 1 started, RUNNING.
  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 1);
  EXPECT_EQ(event.state(), v1::PENDING);
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), v1::GENERATION_STARTED);
  EXPECT_EQ(event.worker_ids_size(), 2);
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 3);
  EXPECT_EQ(event.state(), v1::RUNNING);

  // Live: progress, then both ranks finish.
  v1::ReportProgressResponse progress;
  ASSERT_TRUE(ReportProgress(job, 0, 1, false, &progress).ok());
  EXPECT_TRUE(progress.continue_running());
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 4);
  EXPECT_EQ(event.type(), v1::PROGRESS);
  EXPECT_EQ(event.progress().step(), 1);
  ASSERT_TRUE(ReportProgress(job, 1, 2, true, &progress).ok());
  ASSERT_TRUE(ReportProgress(job, 0, 2, true, &progress).ok());
  std::vector<v1::JobEvent> rest;
  while (reader->Read(&event)) rest.push_back(event);
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].type(), v1::PROGRESS);
  EXPECT_EQ(rest[0].progress().step(), 2);
  EXPECT_EQ(rest[1].type(), v1::STATE_CHANGED);
  EXPECT_EQ(rest[1].state(), v1::SUCCEEDED);
  EXPECT_EQ(rest[1].sequence(), 6);
  EXPECT_EQ(GetJob(job.id()).state(), v1::SUCCEEDED);

  // A later watcher asks only for what came after sequence 3.
  std::vector<v1::JobEvent> replay;
  ASSERT_TRUE(WatchAll(job.id(), 3, &replay).ok());
  ASSERT_EQ(replay.size(), 3u);
  EXPECT_EQ(replay[0].sequence(), 4);
  EXPECT_EQ(replay[2].state(), v1::SUCCEEDED);
  // Past the end: nothing, and the stream ends at once.
  replay.clear();
  ASSERT_TRUE(WatchAll(job.id(), 6, &replay).ok());
  EXPECT_TRUE(replay.empty());
}

TEST_F(CoordinatorServiceTest, SlowWatcherDoesNotBlockProgressAndLosesItsStream) {
  ServiceOptions service;
  service.max_watch_backlog = 4;
  StartServer(service);
  Register("only-rank");
  const v1::Job job = GetJob(Submit(WithSteps(Spec("chatty", 1), 3000)).id());
  ASSERT_EQ(job.state(), v1::RUNNING);

  // Its own connection with a fixed 64 KiB flow-control window, never read until the end.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt("zeroshard.test_channel", 1);
  std::unique_ptr<Stub> slow_stub = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(server_->grpc_target(), grpc::InsecureChannelCredentials(), args));
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(60));
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> slow = slow_stub->WatchJob(&context, request);

  // Far more than a 64 KiB window holds: each report from rank 0 is one PROGRESS event.
  constexpr int kReports = 3000;
  absl::Duration slowest;
  for (int step = 1; step <= kReports; ++step) {
    const absl::Time start = absl::Now();
    v1::ReportProgressResponse response;
    const grpc::Status status = ReportProgress(job, 0, step, false, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_TRUE(response.continue_running());
    slowest = std::max(slowest, absl::Now() - start);
  }
  EXPECT_LT(slowest, absl::Seconds(5));
  EXPECT_EQ(GetJob(job.id()).progress().step(), kReports);

  int64_t last_sequence = 0;
  v1::JobEvent event;
  while (slow->Read(&event)) {
    EXPECT_EQ(event.sequence(), last_sequence + 1);
    last_sequence = event.sequence();
  }
  const grpc::Status status = slow->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "fell behind")) << status.error_message();
  EXPECT_LT(last_sequence, 3 + kReports);
}

TEST_F(CoordinatorServiceTest, WatchFromTheStartPagesALongHistoryThenFollowsLive) {
  StartServer();
  Register("only-rank");
  // Every report is one step; the last one finishes the job.
  const v1::Job job = GetJob(Submit(WithSteps(Spec("long", 1), 20000 + 1000 + 2)).id());
  ASSERT_EQ(job.state(), v1::RUNNING);
  // Far more history than a watcher may queue (max_watch_backlog, 4096): sent all at once it
  // would end the stream with RESOURCE_EXHAUSTED.
  constexpr int kHistoryReports = 20000;
  int64_t step = 0;
  auto report = [&](bool finished) {
    v1::ReportProgressResponse response;
    const grpc::Status status = ReportProgress(job, 0, ++step, finished, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  };
  for (int i = 0; i < kHistoryReports; ++i) report(false);
  const int64_t history_end = 3 + kHistoryReports;  // PENDING, GENERATION_STARTED, RUNNING first

  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(120));
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  int64_t last_sequence = 0;
  int64_t last_step = 0;
  v1::JobEvent event;
  // Reads the next event and checks that it is the next sequence, and for progress the next step.
  auto read_next = [&]() {
    ASSERT_TRUE(reader->Read(&event)) << "after sequence " << last_sequence;
    ASSERT_EQ(event.sequence(), last_sequence + 1);
    last_sequence = event.sequence();
    if (event.type() == v1::PROGRESS) {
      ASSERT_EQ(event.progress().step(), last_step + 1);
      last_step = event.progress().step();
    }
  };
  // Partway through the history, more events are written: the watcher gets them too, once.
  while (last_sequence < 1000) ASSERT_NO_FATAL_FAILURE(read_next());
  constexpr int kReportsWhileWatching = 1000;
  for (int i = 0; i < kReportsWhileWatching; ++i) report(false);
  while (last_sequence < history_end + kReportsWhileWatching) {
    ASSERT_NO_FATAL_FAILURE(read_next());
  }
  EXPECT_EQ(last_step, step);

  // Caught up: a live event arrives as the next sequence, then the end.
  report(false);
  ASSERT_NO_FATAL_FAILURE(read_next());
  EXPECT_EQ(event.type(), v1::PROGRESS);
  EXPECT_EQ(event.progress().step(), step);
  report(true);
  ASSERT_NO_FATAL_FAILURE(read_next());
  EXPECT_EQ(event.progress().step(), step);
  ASSERT_NO_FATAL_FAILURE(read_next());
  EXPECT_EQ(event.type(), v1::STATE_CHANGED);
  EXPECT_EQ(event.state(), v1::SUCCEEDED);
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();

  // The ended job's whole history again, from the start, over a fresh stream.
  std::vector<v1::JobEvent> replay;
  ASSERT_TRUE(WatchAll(job.id(), 0, &replay).ok());
  ASSERT_EQ(static_cast<int64_t>(replay.size()), last_sequence);
  for (size_t i = 0; i < replay.size(); ++i) {
    ASSERT_EQ(replay[i].sequence(), static_cast<int64_t>(i) + 1);
  }
}

// ---- Ops surface ----

TEST_F(CoordinatorServiceTest, HealthCheckingSaysServing) {
  StartServer();
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  SetDeadline(context);
  // grpc.health.v1.HealthCheckRequest{service: ""}: the empty message.
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      generic.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", ToByteBuffer(""), &queue);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, &call);
  ASSERT_TRUE(NextOk(queue, &call));
  ASSERT_TRUE(status.ok()) << status.error_message();
  // HealthCheckResponse{status: SERVING (1)}: field 1, varint 1.
  EXPECT_EQ(FromByteBuffer(response), std::string("\x08\x01", 2));
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
}

TEST_F(CoordinatorServiceTest, ReflectionListsTheCoordinatorService) {
  StartServer();
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = generic.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  int start_tag, write_tag, done_tag, read_tag, finish_tag;
  call->StartCall(&start_tag);
  ASSERT_TRUE(NextOk(queue, &start_tag));
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
  call->Write(ToByteBuffer(std::string("\x3a\x00", 2)), &write_tag);
  ASSERT_TRUE(NextOk(queue, &write_tag));
  call->WritesDone(&done_tag);
  ASSERT_TRUE(NextOk(queue, &done_tag));
  std::string responses;
  grpc::ByteBuffer response;
  call->Read(&response, &read_tag);
  while (NextOk(queue, &read_tag)) {
    responses += FromByteBuffer(response);
    call->Read(&response, &read_tag);
  }
  grpc::Status status;
  call->Finish(&status, &finish_tag);
  ASSERT_TRUE(NextOk(queue, &finish_tag));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(absl::StrContains(responses, "zeroshard.v1.Coordinator"));
  EXPECT_TRUE(absl::StrContains(responses, "grpc.health.v1.Health"));
  // The coordinator's own reflection service, under both package names newer and older clients
  // ask for.
  EXPECT_TRUE(absl::StrContains(responses, "grpc.reflection.v1alpha.ServerReflection"));
  EXPECT_TRUE(absl::StrContains(responses, "grpc.reflection.v1.ServerReflection"));
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
}

TEST_F(CoordinatorServiceTest, MetricsEndpointShowsWorkersJobsRpcsAndHeartbeatLag) {
  StartServer();
  const std::string worker = Register("metered");
  v1::HeartbeatResponse heartbeat;
  ASSERT_TRUE(Heartbeat(worker, &heartbeat).ok());
  ASSERT_EQ(Heartbeat("worker-999999", &heartbeat).error_code(), grpc::StatusCode::NOT_FOUND);
  Submit(Spec("metered-job", 2));
  clock_.Advance(absl::Milliseconds(1500));

  absl::StatusOr<http::testing::HttpReply> result =
      http::testing::Get(server_->metrics_port(), "/metrics", absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(result->content_type, "text/plain; version=0.0.4");
  const std::string& body = result->body;
  EXPECT_TRUE(absl::StrContains(body, "zeroshard_workers{state=\"IDLE\"} 1")) << body;
  EXPECT_TRUE(absl::StrContains(body, "zeroshard_jobs{state=\"PENDING\"} 1")) << body;
  EXPECT_TRUE(
      absl::StrContains(body, "zeroshard_rpcs_total{method=\"RegisterWorker\",code=\"OK\"} 1"))
      << body;
  EXPECT_TRUE(absl::StrContains(body, "zeroshard_rpcs_total{method=\"Heartbeat\",code=\"OK\"} 1"))
      << body;
  EXPECT_TRUE(
      absl::StrContains(body, "zeroshard_rpcs_total{method=\"Heartbeat\",code=\"NOT_FOUND\"} 1"))
      << body;
  EXPECT_TRUE(absl::StrContains(body, "zeroshard_rpcs_total{method=\"SubmitJob\",code=\"OK\"} 1"))
      << body;
  EXPECT_TRUE(absl::StrContains(body, "zeroshard_rpc_latency_seconds_count{method=\"Heartbeat\"}"))
      << body;
  EXPECT_TRUE(absl::StrContains(body, "zeroshard_heartbeat_lag_seconds 1.500000")) << body;
}

// The probe's case: idle sockets and clients trickling one byte every 1-2 s against the metrics
// port must not stop /healthz and /metrics from answering (the target is 100 ms; the bound here
// is generous for a loaded CI machine, docs/performance.md has the measured figures).
TEST_F(CoordinatorServiceTest, HealthAndMetricsAnswerWhileSlowAndIdleClientsHoldConnections) {
  StartServer();
  Register("metered");
  const int port = server_->metrics_port();
  std::vector<http::testing::RawConnection> idle;
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<http::testing::RawConnection> connection =
        http::testing::RawConnection::Open(port);
    ASSERT_TRUE(connection.ok()) << connection.status();
    idle.push_back(*std::move(connection));
  }
  absl::StatusOr<std::unique_ptr<http::testing::SlowClients>> slow =
      http::testing::SlowClients::Open(port, 64);
  ASSERT_TRUE(slow.ok()) << slow.status();
  // Every slow client is part-way into its request (two bytes each) before the probes start.
  ASSERT_TRUE((*slow)->WaitForBytes(128, absl::Now() + absl::Seconds(30)));

  std::vector<absl::Duration> health_latencies;
  std::vector<absl::Duration> metrics_latencies;
  for (int round = 0; round < 20; ++round) {
    for (const char* path : {"/healthz", "/metrics"}) {
      const absl::Time start = absl::Now();
      absl::StatusOr<http::testing::HttpReply> reply =
          http::testing::Get(port, path, start + absl::Seconds(10));
      const absl::Duration latency = absl::Now() - start;
      ASSERT_TRUE(reply.ok()) << path << ": " << reply.status();
      ASSERT_EQ(reply->status, 200) << path;
      EXPECT_LT(latency, absl::Seconds(1)) << path;
      if (absl::string_view(path) == "/healthz") {
        EXPECT_EQ(reply->body, "ok\n");
        health_latencies.push_back(latency);
      } else {
        EXPECT_TRUE(absl::StrContains(reply->body, "zeroshard_workers{state=\"IDLE\"} 1"));
        metrics_latencies.push_back(latency);
      }
    }
    // Pacing: spreads the probes over the slow clients' sends.
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ((*slow)->send_errors(), 0) << "the server closed a slow client early";
  for (auto* latencies : {&health_latencies, &metrics_latencies}) {
    std::sort(latencies->begin(), latencies->end());
    std::printf("%s with 64 idle + 64 slow clients: median %.2f ms, max %.2f ms (%zu probes)\n",
                latencies == &health_latencies ? "/healthz" : "/metrics",
                absl::ToDoubleMilliseconds((*latencies)[latencies->size() / 2]),
                absl::ToDoubleMilliseconds(latencies->back()), latencies->size());
  }
}

// ---- Leases ----

TEST_F(CoordinatorServiceTest, LeaseExpiryEndsTheGenerationAndTheSurvivorAborts) {
  StartServer();
  const std::string silent = Register("silent", "host-a");
  const std::string survivor = Register("survivor", "host-b");
  const v1::Job job = GetJob(Submit(Spec("pair", 2)).id());
  ASSERT_EQ(job.state(), v1::RUNNING);
  v1::HeartbeatResponse heartbeat;
  ASSERT_TRUE(Heartbeat(survivor, &heartbeat).ok());
  EXPECT_EQ(heartbeat.assignment().kind(), v1::ASSIGNMENT_RUN);
  EXPECT_EQ(heartbeat.assignment().generation(), 1);

  // The lease is 3 s: the survivor beats every second (still running generation 1), the other
  // worker stays silent.
  v1::WorkerStatus running;
  running.set_job_id(job.id());
  running.set_generation(1);
  for (int second = 0; second < 4; ++second) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(Heartbeat(survivor, &heartbeat, kRpcDeadline, running).ok());
  }
  server_->manager()->Tick();

  EXPECT_EQ(Heartbeat(silent, &heartbeat).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Heartbeat(survivor, &heartbeat, kRpcDeadline, running).ok());
  EXPECT_EQ(heartbeat.assignment().kind(), v1::ASSIGNMENT_ABORT);
  EXPECT_EQ(heartbeat.assignment().job_id(), job.id());
  EXPECT_EQ(heartbeat.assignment().generation(), 1);
  const v1::Job recovering = GetJob(job.id());
  EXPECT_EQ(recovering.state(), v1::RECOVERING);
  EXPECT_TRUE(absl::StrContains(recovering.message(), "lease expired")) << recovering.message();
  // The old generation's store namespace is gone.
  v1::StoreSetRequest set;
  set.set_job_id(job.id());
  set.set_generation(1);
  set.set_key("k");
  v1::StoreSetResponse set_response;
  grpc::ClientContext context;
  SetDeadline(context);
  EXPECT_EQ(stub_->StoreSet(&context, set, &set_response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// ---- Listings ----

// The probe's case: 600 workers with 32 labels each (about 6 MiB of WorkerInfo) are listed
// completely, in registration order, through pages that each stay under gRPC's 4 MiB limit:
// 100 a page by default, and at most 2 MiB a page where page_size asks for 1000. They still are
// once every one of them is DEAD, and until --dead_worker_retention has passed.
TEST_F(CoordinatorServiceTest, SixHundredLabelledWorkersAreListedThroughPages) {
  dead_worker_retention_ = absl::Minutes(2);
  StartServer();
  std::vector<std::string> registered;
  for (int i = 0; i < 600; ++i) registered.push_back(RegisterLabelled(i));

  std::vector<v1::WorkerInfo> listed;
  int pages = 0;
  ASSERT_TRUE(ListAllWorkers(v1::ListWorkersRequest(), &listed, &pages).ok());
  EXPECT_EQ(Ids(listed), registered);
  EXPECT_EQ(pages, 6);
  ASSERT_FALSE(listed.empty());
  EXPECT_EQ(listed[0].labels_size(), kMaxWorkerLabels);

  v1::ListWorkersRequest big_pages;
  big_pages.set_page_size(kMaxListPageSize);
  listed.clear();
  ASSERT_TRUE(ListAllWorkers(big_pages, &listed, &pages).ok());
  EXPECT_EQ(Ids(listed), registered);
  EXPECT_GE(pages, 3) << "about 6 MiB in pages of at most 2 MiB";

  // Past the 3 s lease every worker is DEAD and still listed, in pages.
  clock_.Advance(absl::Seconds(4));
  server_->manager()->Tick();
  v1::ListWorkersRequest dead;
  dead.set_state(v1::DEAD);
  dead.set_page_size(kMaxListPageSize);
  listed.clear();
  ASSERT_TRUE(ListAllWorkers(dead, &listed, &pages).ok());
  EXPECT_EQ(Ids(listed), registered);
}

// Workers that left or died are listed for --dead_worker_retention after their lease ended,
// then forgotten; live workers stay.
TEST_F(CoordinatorServiceTest, DeadWorkersAreForgottenAfterTheRetention) {
  dead_worker_retention_ = absl::Minutes(2);
  StartServer();
  const std::string live = Register("live", "host-a");
  const std::string dies = Register("dies", "host-b");
  const std::string leaves = Register("leaves", "host-c");
  {
    v1::LeaveWorkerRequest leave;
    leave.set_worker_id(leaves);
    v1::LeaveWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->LeaveWorker(&context, leave, &response).ok());
  }
  auto listed_ids = [&] {
    std::vector<v1::WorkerInfo> workers;
    int pages = 0;
    EXPECT_TRUE(ListAllWorkers(v1::ListWorkersRequest(), &workers, &pages).ok());
    return Ids(workers);
  };
  // The live worker beats every second; "dies" stays silent and its 3 s lease ends.
  v1::HeartbeatResponse heartbeat;
  auto advance = [&](absl::Duration by) {
    for (absl::Duration done; done < by; done += absl::Seconds(1)) {
      clock_.Advance(absl::Seconds(1));
      ASSERT_TRUE(Heartbeat(live, &heartbeat).ok());
    }
    server_->manager()->Tick();
  };
  advance(absl::Seconds(4));
  std::vector<v1::WorkerInfo> dead_workers;
  int pages = 0;
  v1::ListWorkersRequest dead;
  dead.set_state(v1::DEAD);
  ASSERT_TRUE(ListAllWorkers(dead, &dead_workers, &pages).ok());
  EXPECT_EQ(Ids(dead_workers), std::vector<std::string>{dies});
  EXPECT_EQ(listed_ids(), (std::vector<std::string>{live, dies, leaves}));

  // Within the retention (counted from each lease's end) both are still listed.
  advance(absl::Minutes(2) - absl::Seconds(4));
  EXPECT_EQ(listed_ids(), (std::vector<std::string>{live, dies, leaves}));
  // Past it they are gone.
  advance(absl::Seconds(4));
  EXPECT_EQ(listed_ids(), std::vector<std::string>{live});
}

TEST_F(CoordinatorServiceTest, ListJobsPagesNewestFirstAndKeepsLimit) {
  StartServer();
  std::vector<std::string> newest_first;
  for (int i = 0; i < 5; ++i) newest_first.insert(newest_first.begin(), Submit(Spec("j", 1)).id());

  v1::ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> listed;
  int pages = 0;
  while (true) {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->ListJobs(&context, request, &response).ok());
    ++pages;
    ASSERT_LE(response.jobs_size(), 2);
    for (const v1::Job& job : response.jobs()) listed.push_back(job.id());
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  EXPECT_EQ(listed, newest_first);
  EXPECT_EQ(pages, 3);

  // `limit`, page_size's older name, still bounds the reply (and now says where to go on).
  v1::ListJobsRequest limited;
  limited.set_limit(3);
  v1::ListJobsResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->ListJobs(&context, limited, &response).ok());
  ASSERT_EQ(response.jobs_size(), 3);
  EXPECT_EQ(response.jobs(0).id(), newest_first[0]);
  EXPECT_FALSE(response.next_page_token().empty());
}

TEST_F(CoordinatorServiceTest, ABadPageTokenIsInvalidArgumentNamingIt) {
  StartServer();
  Register("a");
  Submit(Spec("j", 1));
  for (const std::string& token :
       {std::string("garbage"), std::string("d29ya2VyLTAwMDAwMQ"),  // "worker-000001" in ListJobs
        std::string(4096, 'A')}) {
    v1::ListJobsRequest jobs;
    jobs.set_page_token(token);
    v1::ListJobsResponse jobs_response;
    grpc::ClientContext jobs_context;
    SetDeadline(jobs_context);
    const grpc::Status jobs_status = stub_->ListJobs(&jobs_context, jobs, &jobs_response);
    EXPECT_EQ(jobs_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StartsWith(jobs_status.error_message(), "page_token: "))
        << jobs_status.error_message();
  }
  v1::ListWorkersRequest workers;
  workers.set_page_token("job-000001");
  v1::ListWorkersResponse workers_response;
  grpc::ClientContext workers_context;
  SetDeadline(workers_context);
  const grpc::Status workers_status =
      stub_->ListWorkers(&workers_context, workers, &workers_response);
  EXPECT_EQ(workers_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(workers_status.error_message(),
            "page_token: not a token from a previous ListWorkers reply");
}

// ---- Scheduling ----

// The probe's case on a real coordinator: a 3-worker job on a 2-worker cluster, waiting past
// --max_backfill_wait (30 s), does not keep a 1-worker job from the idle workers, and its message
// says why it waits. Once a third worker registers it reserves the idle ones and starts when the
// small job finishes, while a later small job waits.
TEST_F(CoordinatorServiceTest, AJobLargerThanTheClusterBlocksNobodyUntilAWorkerJoins) {
  StartServer();
  std::vector<std::string> workers = {Register("a", "host-a"), Register("b", "host-b")};
  v1::JobSpec three_spec = Spec("three", 3);
  three_spec.set_global_batch(96);
  const v1::Job three = Submit(three_spec);
  EXPECT_EQ(three.state(), v1::PENDING);
  EXPECT_TRUE(absl::StrContains(three.message(),
                                "unschedulable: needs 3 CPU workers and the cluster has 2 live"))
      << three.message();
  // 31 s in heartbeat-sized steps, so that the leases (3 s) hold.
  v1::HeartbeatResponse heartbeat;
  for (int second = 0; second < 31; ++second) {
    clock_.Advance(absl::Seconds(1));
    for (const std::string& worker : workers) ASSERT_TRUE(Heartbeat(worker, &heartbeat).ok());
  }
  server_->manager()->Tick();

  const v1::Job one = GetJob(Submit(WithSteps(Spec("one", 1), 1)).id());
  ASSERT_EQ(one.state(), v1::RUNNING) << one.message();
  const v1::Job still_waiting = GetJob(three.id());
  EXPECT_EQ(still_waiting.state(), v1::PENDING);
  EXPECT_TRUE(
      absl::StrContains(still_waiting.message(), "needs 3 CPU workers and the cluster has 2 live"))
      << still_waiting.message();

  workers.push_back(Register("c", "host-c"));
  const v1::Job reserved = GetJob(three.id());
  EXPECT_EQ(reserved.state(), v1::PENDING);
  EXPECT_EQ(reserved.message(), "") << "it fits the cluster now";
  // The two idle workers are held for "three", which waited past the bound.
  const v1::Job two = Submit(Spec("two", 1));
  EXPECT_EQ(GetJob(two.id()).state(), v1::PENDING);

  v1::ReportProgressResponse progress;
  ASSERT_TRUE(ReportProgress(one, 0, 1, true, &progress).ok());
  ASSERT_EQ(GetJob(one.id()).state(), v1::SUCCEEDED);
  const v1::Job started = GetJob(three.id());
  ASSERT_EQ(started.state(), v1::RUNNING) << started.message();
  EXPECT_EQ(started.worker_ids_size(), 3);
  EXPECT_EQ(GetJob(two.id()).state(), v1::PENDING);
}

// ---- ExportCheckpoint ----

// An export stream read to its end.
struct ExportRead {
  grpc::Status status;
  std::vector<v1::ExportCheckpointChunk> chunks;

  std::string file() const {
    std::string bytes;
    for (const v1::ExportCheckpointChunk& chunk : chunks) bytes += chunk.data();
    return bytes;
  }
};

ExportRead ReadExport(Stub& stub, const std::string& job_id, std::optional<int64_t> step) {
  v1::ExportCheckpointRequest request;
  request.set_job_id(job_id);
  if (step.has_value()) request.set_step(*step);
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(60));
  std::unique_ptr<grpc::ClientReader<v1::ExportCheckpointChunk>> reader =
      stub.ExportCheckpoint(&context, request);
  ExportRead read;
  v1::ExportCheckpointChunk chunk;
  while (reader->Read(&chunk)) read.chunks.push_back(chunk);
  read.status = reader->Finish();
  return read;
}

// An empty checkpoint root named after the test.
std::string FreshCheckpointRoot() { return FreshTestDir("-checkpoints"); }

// Issue 24, item 4. Before it CommitCheckpoint wrote the manifest (and pruned) holding the
// JobManager's only lock, so on a slow volume every heartbeat, registration and query waited
// behind the commit's fsync; here they would have missed their deadlines until the release.
TEST_F(CoordinatorServiceTest, HeartbeatsAreAnsweredWhileACommitIsBlockedInItsManifestWrite) {
  const std::string root = FreshCheckpointRoot();
  auto hooks = std::make_shared<checkpoint::testing::TestStorageHooks>();
  storage_hooks_ = hooks;
  StartServer({}, root);
  hooks->HoldAt(checkpoint::StorageOperation::kRename, checkpoint::kManifestFileName);
  testing::CheckpointedJobOptions options;
  options.finish = false;
  options.checkpoint_steps = {2};
  absl::StatusOr<v1::Job> committed = absl::UnknownError("not run");
  std::thread commits([&] { committed = testing::RunCheckpointedJob(*stub_, root, options); });
  ASSERT_TRUE(hooks->AwaitHeld(absl::Seconds(30))) << "the manifest was never written";

  // The commit is stuck in the volume: a worker registers and beats, a client reads the job.
  const absl::Time start = absl::Now();
  const std::string bystander = Register("bystander");
  ASSERT_FALSE(bystander.empty());
  v1::HeartbeatRequest beat;
  beat.set_worker_id(bystander);
  v1::HeartbeatResponse beat_response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  const grpc::Status beaten = stub_->Heartbeat(&context, beat, &beat_response);
  EXPECT_TRUE(beaten.ok()) << beaten.error_message();
  v1::ListJobsResponse jobs;
  grpc::ClientContext list_context;
  list_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  ASSERT_TRUE(stub_->ListJobs(&list_context, v1::ListJobsRequest(), &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  // Not recorded while its manifest is not there.
  EXPECT_FALSE(jobs.jobs(0).has_latest_checkpoint());
  EXPECT_EQ(hooks->held(), 1);
  std::cout << "answered in " << absl::Now() - start << " while the commit was held\n";

  hooks->Release();
  commits.join();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->latest_checkpoint().step(), 2);
}

TEST_F(CoordinatorServiceTest, ExportStreamsTheFinalCheckpointOrACommittedStepInChunks) {
  const std::string root = FreshCheckpointRoot();
  StartServer({}, root);
  testing::CheckpointedJobOptions options;
  options.finish = false;
  absl::StatusOr<v1::Job> running = testing::RunCheckpointedJob(*stub_, root, options);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING);
  ASSERT_EQ(running->latest_checkpoint().step(), 4);
  const std::string& job_id = running->id();

  // Still running: no final state yet, but any committed step exports.
  const ExportRead no_final = ReadExport(*stub_, job_id, std::nullopt);
  EXPECT_EQ(no_final.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StartsWith(no_final.status.error_message(), "job_id: ") &&
              absl::StrContains(no_final.status.error_message(), "has no final checkpoint") &&
              absl::StrContains(no_final.status.error_message(), "committed steps: 2, 4"))
      << no_final.status.error_message();
  EXPECT_TRUE(no_final.chunks.empty());
  const ExportRead step2 = ReadExport(*stub_, job_id, 2);
  ASSERT_TRUE(step2.status.ok()) << step2.status.error_message();
  ASSERT_FALSE(step2.chunks.empty());
  EXPECT_EQ(step2.chunks[0].step(), 2);
  EXPECT_FALSE(step2.chunks[0].final_state());
  absl::StatusOr<std::string> expected_step2 = testing::ExpectedExport(root, *running, 2, false);
  ASSERT_TRUE(expected_step2.ok()) << expected_step2.status();
  EXPECT_TRUE(step2.file() == *expected_step2) << "step 2's export differs";

  // Every rank finishes: the job SUCCEEDED with a checkpoint at its last step, its final state.
  v1::ReportProgressResponse progress;
  for (int32_t rank : {0, 1}) ASSERT_TRUE(ReportProgress(*running, rank, 4, true, &progress).ok());
  ASSERT_EQ(GetJob(job_id).state(), v1::SUCCEEDED);
  const ExportRead final_state = ReadExport(*stub_, job_id, std::nullopt);
  ASSERT_TRUE(final_state.status.ok()) << final_state.status.error_message();
  absl::StatusOr<std::string> expected = testing::ExpectedExport(root, *running, 4, true);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(final_state.file() == *expected) << "the final export differs";
  ASSERT_GT(final_state.chunks.size(), 4u);  // 4.26 MB in 1 MiB chunks
  const v1::ExportCheckpointChunk& first = final_state.chunks.front();
  EXPECT_EQ(first.step(), 4);
  EXPECT_TRUE(first.final_state());
  EXPECT_EQ(first.tensor_count(), 4);
  EXPECT_EQ(first.total_bytes(), static_cast<int64_t>(expected->size()));
  for (size_t i = 0; i < final_state.chunks.size(); ++i) {
    const v1::ExportCheckpointChunk& chunk = final_state.chunks[i];
    // Full chunks but the last; the announcement in the first only.
    const bool last = i + 1 == final_state.chunks.size();
    EXPECT_TRUE(last ? chunk.data().size() <= (size_t{1} << 20)
                     : chunk.data().size() == (size_t{1} << 20))
        << "chunk " << i << ": " << chunk.data().size() << " bytes";
    EXPECT_TRUE(i == 0 || chunk.total_bytes() == 0) << "chunk " << i;
  }
  // Asked for by its step, the final checkpoint is still the final state.
  const ExportRead by_step = ReadExport(*stub_, job_id, 4);
  ASSERT_TRUE(by_step.status.ok()) << by_step.status.error_message();
  EXPECT_TRUE(by_step.chunks.front().final_state());
  EXPECT_TRUE(by_step.file() == *expected) << "step 4's export differs from the final one";

  const ExportRead uncommitted = ReadExport(*stub_, job_id, 3);
  EXPECT_EQ(uncommitted.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(absl::StartsWith(uncommitted.status.error_message(), "step: ") &&
              absl::StrContains(uncommitted.status.error_message(), "committed steps: 2, 4"))
      << uncommitted.status.error_message();
  EXPECT_EQ(ReadExport(*stub_, "job-999999", std::nullopt).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  const ExportRead negative = ReadExport(*stub_, job_id, -1);
  EXPECT_EQ(negative.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(negative.status.error_message(), "step: "))
      << negative.status.error_message();
}

TEST_F(CoordinatorServiceTest, ExportWithoutACheckpointRootNamesTheFlag) {
  StartServer();
  Register("only-rank");
  const v1::Job job = Submit(Spec("no-root", 1));
  for (std::optional<int64_t> step : {std::optional<int64_t>(), std::optional<int64_t>(1)}) {
    const ExportRead refused = ReadExport(*stub_, job.id(), step);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(absl::StrContains(refused.status.error_message(), "--checkpoint_root"))
        << refused.status.error_message();
  }
}

TEST_F(CoordinatorServiceTest, AStalledExportWaitsForItsClientUntilCancelled) {
  absl::Mutex mu;
  std::vector<int64_t> waited_at;  // bytes queued each time a reading thread waited
  ServiceOptions service;
  service.max_concurrent_exports = 1;
  service.export_waits_for_testing = [&](int64_t bytes_queued) {
    absl::MutexLock lock(&mu);
    waited_at.push_back(bytes_queued);
  };
  const std::string root = FreshCheckpointRoot();
  StartServer(service, root);
  testing::CheckpointedJobOptions options;
  options.name = "large";
  options.layer_sizes = {2048, 2048, 16};  // 16.8 MB exported
  options.checkpoint_steps = {4};
  options.states = {{"param", v1::FLOAT32}};
  absl::StatusOr<v1::Job> job = testing::RunCheckpointedJob(*stub_, root, options);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::string> expected = testing::ExpectedExport(root, *job, 4, true);
  ASSERT_TRUE(expected.ok()) << expected.status();

  // Its own connection with a fixed 64 KiB flow-control window, read once and then not again.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt("zeroshard.test_channel", 2);
  std::unique_ptr<Stub> slow_stub = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(server_->grpc_target(), grpc::InsecureChannelCredentials(), args));
  v1::ExportCheckpointRequest request;
  request.set_job_id(job->id());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(60));
  std::unique_ptr<grpc::ClientReader<v1::ExportCheckpointChunk>> stalled =
      slow_stub->ExportCheckpoint(&context, request);
  v1::ExportCheckpointChunk first;
  ASSERT_TRUE(stalled->Read(&first));
  EXPECT_EQ(first.total_bytes(), static_cast<int64_t>(expected->size()));

  // The stalled stream's thread waits for its client with most of the file unread, holding the
  // one export slot, while everything else is answered.
  {
    absl::MutexLock lock(&mu);
    auto waited = [&waited_at] { return !waited_at.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&waited), absl::Seconds(10)));
    EXPECT_LT(waited_at.front(), first.total_bytes() / 2);
  }
  EXPECT_EQ(ReadExport(*stub_, job->id(), std::nullopt).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(GetJob(job->id()).state(), v1::SUCCEEDED);

  // Cancelled, it stops reading and frees the slot.
  context.TryCancel();
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ExportRead after = ReadExport(*stub_, job->id(), std::nullopt);
  while (after.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
         absl::Now() < deadline) {
    after = ReadExport(*stub_, job->id(), std::nullopt);
  }
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_TRUE(after.file() == *expected) << "the export after the cancelled one differs";
}

}  // namespace
}  // namespace zeroshard::coordinator
