// Request validation: a valid request of every RPC passes, and a table of malformed requests
// across the RPCs each fails with INVALID_ARGUMENT and a message naming the field.
#include "coordinator/request_validation.h"

#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/page_token.h"
#include "gtest/gtest.h"
#include "jobspec/job_plan.h"

namespace zeroshard::coordinator {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::RegisterWorkerRequest ValidRegister() {
  v1::RegisterWorkerRequest r;
  r.set_name("cpu-0");
  r.set_host("node-1.example.com");
  r.set_device_kind(v1::CPU);
  r.set_device_memory_bytes(int64_t{16} << 30);
  (*r.mutable_labels())["zone"] = "eu-west-1a";
  (*r.mutable_labels())["example.com/rack"] = "r17";
  r.set_attach_socket("/run/zeroshard/cpu-0.sock");
  return r;
}

// A worker the coordinator forgot, registering again with the run it wants adopted.
v1::RegisterWorkerRequest ValidReregister() {
  v1::RegisterWorkerRequest r = ValidRegister();
  r.set_previous_worker_id("worker-000007");
  r.mutable_status()->set_job_id("job-000042");
  r.mutable_status()->set_generation(2);
  r.mutable_status()->set_rank(3);
  r.mutable_status()->set_step(17);
  return r;
}

v1::HeartbeatRequest ValidHeartbeat() {
  v1::HeartbeatRequest r;
  r.set_worker_id("worker-000007");
  r.mutable_status()->set_job_id("job-000042");
  r.mutable_status()->set_generation(2);
  r.mutable_status()->set_step(17);
  r.mutable_status()->set_run_error("UNAVAILABLE: rank 0 lost peer rank 3");
  r.mutable_status()->add_lost_peer_ranks(3);
  r.mutable_status()->add_lost_peer_ranks(65535);
  return r;
}

v1::LeaveWorkerRequest ValidLeave() {
  v1::LeaveWorkerRequest r;
  r.set_worker_id("worker-000007");
  return r;
}

v1::ListWorkersRequest ValidListWorkers() {
  v1::ListWorkersRequest r;
  r.set_state(v1::IDLE);
  r.set_page_size(1000);
  r.set_page_token(MakePageToken("worker-000007"));
  return r;
}

v1::SubmitJobRequest ValidSubmit() {
  v1::SubmitJobRequest r;
  r.mutable_spec()->set_name("mlp");
  r.mutable_spec()->mutable_workload()->set_preset("seed");
  r.mutable_spec()->mutable_optimizer()->set_kind(v1::SGD);
  return r;
}

v1::GetJobRequest ValidGetJob() {
  v1::GetJobRequest r;
  r.set_job_id("job-000042");
  return r;
}

v1::ListJobsRequest ValidListJobs() {
  v1::ListJobsRequest r;
  r.set_state(v1::RUNNING);
  r.set_limit(1000);
  r.set_page_token(MakePageToken("job-000042"));
  return r;
}

v1::CancelJobRequest ValidCancel() {
  v1::CancelJobRequest r;
  r.set_job_id("job-000042");
  r.set_reason(std::string(1024, 'r'));
  return r;
}

v1::WatchJobRequest ValidWatch() {
  v1::WatchJobRequest r;
  r.set_job_id("job-000042");
  r.set_after_sequence(10);
  return r;
}

v1::GetShardPlanRequest ValidGetShardPlan() {
  v1::GetShardPlanRequest r;
  r.set_job_id("job-000042");
  r.set_generation(0);
  r.set_rank(65535);
  return r;
}

v1::StoreSetRequest ValidStoreSet() {
  v1::StoreSetRequest r;
  r.set_job_id("job-000042");
  r.set_generation(1);
  r.set_key(std::string(512, 'k'));
  r.set_value(std::string(size_t{1} << 20, '\0'));
  return r;
}

v1::StoreGetRequest ValidStoreGet() {
  v1::StoreGetRequest r;
  r.set_job_id("job-000042");
  r.set_generation(3);
  r.set_key("nccl/unique-id");
  r.set_timeout_ms(600000);
  return r;
}

v1::StoreAddRequest ValidStoreAdd() {
  v1::StoreAddRequest r;
  r.set_job_id("job-000042");
  r.set_generation(3);
  r.set_key("barrier/0");
  r.set_delta(-5);
  return r;
}

v1::StoreDeleteRequest ValidStoreDelete() {
  v1::StoreDeleteRequest r;
  r.set_job_id("job-000042");
  r.set_generation(3);
  r.set_key("barrier/0");
  return r;
}

v1::ReportProgressRequest ValidProgress() {
  v1::ReportProgressRequest r;
  r.set_worker_id("worker-000007");
  r.set_job_id("job-000042");
  r.set_generation(1);
  r.set_rank(3);
  v1::StepMetrics& m = *r.mutable_metrics();
  m.set_step(10);
  m.set_loss(-1.5);  // a loss may be negative
  m.set_step_ms(12.5);
  m.set_comm_ms(3);
  m.set_exposed_comm_ms(0.5);
  m.set_update_ms(1);
  m.set_allgather_ms(2);
  m.set_grad_norm(0.25);
  m.set_loss_scale(1);
  m.mutable_memory()->set_params_bytes(1000);
  m.mutable_memory()->set_total_bytes(1000);
  for (double ms : {0.0, 2.5, 0.25}) m.add_bucket_exposed_ms(ms);
  for (double ms : {0.0, 2.0, 0.25}) m.add_bucket_exposed_in_backward_ms(ms);
  m.set_compute_thread_cpu_ms(10);
  m.set_comm_thread_cpu_ms(4);
  m.set_process_cpu_ms(20);
  return r;
}

v1::CommitCheckpointRequest ValidCommit() {
  v1::CommitCheckpointRequest r;
  r.set_worker_id("worker-000007");
  r.set_job_id("job-000042");
  r.set_generation(1);
  r.set_rank(0);
  r.set_step(100);
  r.set_path("job-000042/step-100/rank-0.ckpt");
  r.set_bytes(4096);
  r.set_crc32c(0xdeadbeef);
  return r;
}

v1::RewindJobRequest ValidRewind() {
  v1::RewindJobRequest r;
  r.set_worker_id("worker-000007");
  r.set_job_id("job-000042");
  r.set_generation(1);
  r.set_rank(0);
  r.set_step(30);
  r.set_loaded_job_id("job-000042");
  r.mutable_loaded_checkpoint()->set_step(30);
  r.mutable_loaded_checkpoint()->set_generation(1);
  r.set_reason("rank 0 loaded /ckpt/job-000042/step-000000000030/manifest.json at step 50");
  return r;
}

v1::ExportCheckpointRequest ValidExport() {
  v1::ExportCheckpointRequest r;
  r.set_job_id("job-000042");
  r.set_step(100);
  return r;
}

v1::VerifyCheckpointRequest ValidVerify() {
  v1::VerifyCheckpointRequest r;
  r.set_job_id("job-000042");
  r.set_step(100);
  return r;
}

TEST(RequestValidationTest, ValidRequestsPass) {
  EXPECT_TRUE(ValidateRegisterWorkerRequest(ValidRegister()).ok());
  EXPECT_TRUE(ValidateRegisterWorkerRequest(ValidReregister()).ok());
  EXPECT_TRUE(ValidateHeartbeatRequest(ValidHeartbeat()).ok());
  EXPECT_TRUE(ValidateLeaveWorkerRequest(ValidLeave()).ok());
  EXPECT_TRUE(ValidateListWorkersRequest(ValidListWorkers()).ok());
  EXPECT_TRUE(ValidateSubmitJobRequest(ValidSubmit()).ok());
  // Fails before the fix: ZERO3 was refused as not implemented.
  v1::SubmitJobRequest zero3 = ValidSubmit();
  zero3.mutable_spec()->set_mode(v1::ZERO3);
  zero3.mutable_spec()->set_gather_pool_buckets(8);
  EXPECT_TRUE(ValidateSubmitJobRequest(zero3).ok());
  EXPECT_TRUE(ValidateGetJobRequest(ValidGetJob()).ok());
  v1::GetJobRequest by_run_key;
  by_run_key.set_run_key("0123abcd-1");
  EXPECT_TRUE(ValidateGetJobRequest(by_run_key).ok());
  EXPECT_TRUE(ValidateListJobsRequest(ValidListJobs()).ok());
  v1::ListJobsRequest paged = ValidListJobs();
  paged.clear_limit();
  paged.set_page_size(1);
  EXPECT_TRUE(ValidateListJobsRequest(paged).ok());
  EXPECT_TRUE(ValidateCancelJobRequest(ValidCancel()).ok());
  EXPECT_TRUE(ValidateWatchJobRequest(ValidWatch()).ok());
  EXPECT_TRUE(ValidateGetShardPlanRequest(ValidGetShardPlan()).ok());
  EXPECT_TRUE(ValidateStoreSetRequest(ValidStoreSet()).ok());
  EXPECT_TRUE(ValidateStoreGetRequest(ValidStoreGet()).ok());
  EXPECT_TRUE(ValidateStoreAddRequest(ValidStoreAdd()).ok());
  EXPECT_TRUE(ValidateStoreDeleteRequest(ValidStoreDelete()).ok());
  EXPECT_TRUE(ValidateReportProgressRequest(ValidProgress()).ok());
  EXPECT_TRUE(ValidateCommitCheckpointRequest(ValidCommit()).ok());
  EXPECT_TRUE(ValidateRewindJobRequest(ValidRewind()).ok());
  v1::RewindJobRequest torch_format = ValidRewind();
  torch_format.clear_loaded_job_id();
  torch_format.clear_loaded_checkpoint();
  torch_format.set_step(0);
  EXPECT_TRUE(ValidateRewindJobRequest(torch_format).ok());
  EXPECT_TRUE(ValidateExportCheckpointRequest(ValidExport()).ok());
  EXPECT_TRUE(ValidateVerifyCheckpointRequest(ValidVerify()).ok());
}

TEST(RequestValidationTest, ASkippedCheckpointNeedsNoFile) {
  v1::CommitCheckpointRequest skipped = ValidCommit();
  skipped.clear_path();
  skipped.set_bytes(-1);
  EXPECT_FALSE(ValidateCommitCheckpointRequest(skipped).ok());
  skipped.set_outcome(v1::CHECKPOINT_SKIPPED);
  skipped.set_message("the previous checkpoint was still being written");
  EXPECT_TRUE(ValidateCommitCheckpointRequest(skipped).ok());
}

TEST(RequestValidationTest, OptionalAndEdgeValuesPass) {
  v1::RegisterWorkerRequest minimal;
  minimal.set_name(std::string(63, 'w'));
  minimal.set_host(std::string(253, 'h'));
  minimal.set_device_kind(v1::CUDA);
  for (int i = 0; i < kMaxWorkerLabels; ++i) {
    (*minimal.mutable_labels())[absl::StrCat("k", i)] = std::string(256, 'v');
  }
  EXPECT_TRUE(ValidateRegisterWorkerRequest(minimal).ok());

  // No attach socket (a worker that serves no attached trainers), or the longest path allowed.
  EXPECT_TRUE(minimal.attach_socket().empty());
  v1::RegisterWorkerRequest longest_socket = minimal;
  longest_socket.set_attach_socket("/" + std::string(106, 's'));
  EXPECT_TRUE(ValidateRegisterWorkerRequest(longest_socket).ok());

  // An idle worker registering again names its old id and no run.
  v1::RegisterWorkerRequest idle_again = minimal;
  idle_again.set_previous_worker_id("worker-000001");
  EXPECT_TRUE(ValidateRegisterWorkerRequest(idle_again).ok());

  v1::HeartbeatRequest idle;
  idle.set_worker_id("worker-1234567");
  EXPECT_TRUE(ValidateHeartbeatRequest(idle).ok());
  v1::HeartbeatRequest last_rank = ValidHeartbeat();
  last_rank.mutable_status()->set_rank(65535);
  last_rank.mutable_status()->set_finished(true);
  EXPECT_TRUE(ValidateHeartbeatRequest(last_rank).ok());

  EXPECT_TRUE(ValidateListWorkersRequest(v1::ListWorkersRequest()).ok());
  v1::ListJobsRequest all;
  EXPECT_TRUE(ValidateListJobsRequest(all).ok());

  v1::StoreGetRequest at_once = ValidStoreGet();
  at_once.set_timeout_ms(0);
  EXPECT_TRUE(ValidateStoreGetRequest(at_once).ok());

  v1::ReportProgressRequest skipped = ValidProgress();
  skipped.mutable_metrics()->set_skipped(true);
  skipped.mutable_metrics()->set_loss(kNaN);
  skipped.mutable_metrics()->set_grad_norm(kInf);
  skipped.mutable_metrics()->set_loss_scale(32768);
  EXPECT_TRUE(ValidateReportProgressRequest(skipped).ok());

  // Per-bucket figures are optional, and up to the limit of them pass.
  v1::ReportProgressRequest no_buckets = ValidProgress();
  no_buckets.mutable_metrics()->clear_bucket_exposed_ms();
  no_buckets.mutable_metrics()->clear_bucket_exposed_in_backward_ms();
  EXPECT_TRUE(ValidateReportProgressRequest(no_buckets).ok());
  v1::ReportProgressRequest most_buckets = no_buckets;
  for (int b = 0; b < jobspec::kMaxReportedBuckets; ++b) {
    most_buckets.mutable_metrics()->add_bucket_exposed_ms(1.0);
    most_buckets.mutable_metrics()->add_bucket_exposed_in_backward_ms(1.0);
  }
  EXPECT_TRUE(ValidateReportProgressRequest(most_buckets).ok());

  v1::CommitCheckpointRequest first = ValidCommit();
  first.set_step(0);
  first.set_bytes(0);
  EXPECT_TRUE(ValidateCommitCheckpointRequest(first).ok());

  v1::ExportCheckpointRequest final_state = ValidExport();
  final_state.clear_step();
  EXPECT_TRUE(ValidateExportCheckpointRequest(final_state).ok());
  v1::ExportCheckpointRequest first_step = ValidExport();
  first_step.set_step(0);
  EXPECT_TRUE(ValidateExportCheckpointRequest(first_step).ok());

  v1::VerifyCheckpointRequest latest = ValidVerify();
  latest.clear_step();
  EXPECT_TRUE(ValidateVerifyCheckpointRequest(latest).ok());
  v1::VerifyCheckpointRequest step_zero = ValidVerify();
  step_zero.set_step(0);
  EXPECT_TRUE(ValidateVerifyCheckpointRequest(step_zero).ok());
}

// One malformed request: `validate` builds it from a valid one and validates it.
struct BadRequest {
  std::string name;
  std::function<absl::Status()> validate;
  std::string field;     // the message starts with "<field>: "
  std::string contains;  // and contains this
};

void PrintTo(const BadRequest& c, std::ostream* os) { *os << c.name; }

template <typename T>
struct NonDeduced {
  using type = T;
};

template <typename Request>
BadRequest Bad(std::string name, Request (*valid)(), absl::Status (*validate)(const Request&),
               typename NonDeduced<std::function<void(Request&)>>::type mutate, std::string field,
               std::string contains) {
  return BadRequest{std::move(name),
                    [=] {
                      Request request = valid();
                      mutate(request);
                      return validate(request);
                    },
                    std::move(field), std::move(contains)};
}

using Register = v1::RegisterWorkerRequest;
using Heartbeat = v1::HeartbeatRequest;
using Progress = v1::ReportProgressRequest;
using Commit = v1::CommitCheckpointRequest;

// Shorthands for the RPCs with many cases.
BadRequest BadRegister(std::string name, std::function<void(Register&)> mutate, std::string field,
                       std::string contains) {
  return Bad<Register>(std::move(name), ValidRegister, ValidateRegisterWorkerRequest,
                       std::move(mutate), std::move(field), std::move(contains));
}

BadRequest BadReregister(std::string name, std::function<void(Register&)> mutate, std::string field,
                         std::string contains) {
  return Bad<Register>(std::move(name), ValidReregister, ValidateRegisterWorkerRequest,
                       std::move(mutate), std::move(field), std::move(contains));
}

BadRequest BadHeartbeat(std::string name, std::function<void(Heartbeat&)> mutate, std::string field,
                        std::string contains) {
  return Bad<Heartbeat>(std::move(name), ValidHeartbeat, ValidateHeartbeatRequest,
                        std::move(mutate), std::move(field), std::move(contains));
}

BadRequest BadProgress(std::string name, std::function<void(Progress&)> mutate, std::string field,
                       std::string contains) {
  return Bad<Progress>(std::move(name), ValidProgress, ValidateReportProgressRequest,
                       std::move(mutate), std::move(field), std::move(contains));
}

BadRequest BadCommit(std::string name, std::function<void(Commit&)> mutate, std::string field,
                     std::string contains) {
  return Bad<Commit>(std::move(name), ValidCommit, ValidateCommitCheckpointRequest,
                     std::move(mutate), std::move(field), std::move(contains));
}

class BadRequestTest : public ::testing::TestWithParam<BadRequest> {};

TEST_P(BadRequestTest, FailsNamingTheField) {
  const BadRequest& c = GetParam();
  const absl::Status status = c.validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), c.field + ": ")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), c.contains)) << status;
}

INSTANTIATE_TEST_SUITE_P(
    Workers, BadRequestTest,
    ::testing::Values(
        BadRegister(
            "EmptyName", [](Register& r) { r.clear_name(); }, "name",
            "must be 1 to 63 characters of [a-z0-9-]"),
        BadRegister(
            "UpperCaseName", [](Register& r) { r.set_name("Worker_1"); }, "name", "\"Worker_1\""),
        BadRegister(
            "EmptyHost", [](Register& r) { r.clear_host(); }, "host",
            "must be 1 to 253 characters of [A-Za-z0-9.-]"),
        BadRegister(
            "LongHost", [](Register& r) { r.set_host(std::string(254, 'h')); }, "host", "1 to 253"),
        BadRegister(
            "HostWithSpace", [](Register& r) { r.set_host("bad host!"); }, "host", "\"bad host!\""),
        BadRegister(
            "HostWithUnderscore", [](Register& r) { r.set_host("a_b"); }, "host", "[A-Za-z0-9.-]"),
        BadRegister(
            "NoDeviceKind", [](Register& r) { r.clear_device_kind(); }, "device_kind",
            "required; allowed: CPU, CUDA"),
        BadRegister(
            "UnknownDeviceKind",
            [](Register& r) { r.set_device_kind(static_cast<v1::DeviceKind>(5)); }, "device_kind",
            "unknown DeviceKind value 5"),
        BadRegister(
            "NegativeDeviceMemory", [](Register& r) { r.set_device_memory_bytes(-1); },
            "device_memory_bytes", "-1 is out of range [0, 1125899906842624]"),
        BadRegister(
            "HugeDeviceMemory",
            [](Register& r) { r.set_device_memory_bytes((int64_t{1} << 50) + 1); },
            "device_memory_bytes", "out of range"),
        // Fails before the fix: memory_limit_bytes did not exist.
        BadRegister(
            "NegativeMemoryLimit", [](Register& r) { r.set_memory_limit_bytes(-1); },
            "memory_limit_bytes", "-1 is out of range [0, 1125899906842624]"),
        BadRegister(
            "HugeMemoryLimit",
            [](Register& r) { r.set_memory_limit_bytes((int64_t{1} << 50) + 1); },
            "memory_limit_bytes", "out of range"),
        BadRegister(
            "TooManyLabels",
            [](Register& r) {
              for (int i = 0; i < 31; ++i) (*r.mutable_labels())[absl::StrCat("l", i)];
            },
            "labels", "33 labels is more than the limit of 32"),
        BadRegister(
            "EmptyLabelKey", [](Register& r) { (*r.mutable_labels())[""]; }, "labels",
            "key \"\" must be 1 to 63 characters of [a-z0-9-._/]"),
        BadRegister(
            "UpperCaseLabelKey", [](Register& r) { (*r.mutable_labels())["Zone"] = "a"; }, "labels",
            "key \"Zone\""),
        BadRegister(
            "LongLabelKey", [](Register& r) { (*r.mutable_labels())[std::string(64, 'k')] = "a"; },
            "labels", "must be 1 to 63"),
        BadRegister(
            "LongLabelValue",
            [](Register& r) { (*r.mutable_labels())["zone"] = std::string(257, 'v'); },
            "labels[\"zone\"]", "257 bytes is longer than the limit of 256"),
        BadReregister(
            "StatusWithoutPreviousWorkerId", [](Register& r) { r.clear_previous_worker_id(); },
            "previous_worker_id", "required when status.job_id is set"),
        BadReregister(
            "BadPreviousWorkerId", [](Register& r) { r.set_previous_worker_id("worker-7"); },
            "previous_worker_id", "\"worker-7\" is not a valid id"),
        BadReregister(
            "BadReregisterStatusJobId",
            [](Register& r) { r.mutable_status()->set_job_id("job-42"); }, "status.job_id",
            "not a valid id"),
        BadReregister(
            "NegativeReregisterStatusRank", [](Register& r) { r.mutable_status()->set_rank(-1); },
            "status.rank", "-1 is out of range [0, 65535]"),
        BadReregister(
            "OversizedReregisterRunError",
            [](Register& r) { r.mutable_status()->set_run_error(std::string(1025, 'e')); },
            "status.run_error", "1025 bytes is longer than the limit of 1024"),
        BadRegister(
            "RelativeAttachSocket", [](Register& r) { r.set_attach_socket("run/w.sock"); },
            "attach_socket", "\"run/w.sock\" is not an absolute path (it must start with /)"),
        BadRegister(
            "LongAttachSocket",
            [](Register& r) { r.set_attach_socket("/" + std::string(107, 's')); }, "attach_socket",
            "108 bytes is longer than the limit of 107"),
        BadRegister(
            "AttachSocketWithNul",
            [](Register& r) { r.set_attach_socket(std::string("/run/a\0b", 8)); }, "attach_socket",
            "contains a control character"),
        BadRegister(
            "AttachSocketWithNewline", [](Register& r) { r.set_attach_socket("/run/a\nb"); },
            "attach_socket", "\"/run/a\\nb\" contains a control character"),
        BadHeartbeat(
            "NoWorkerId", [](Heartbeat& r) { r.clear_worker_id(); }, "worker_id", "required"),
        BadHeartbeat(
            "ShortWorkerId", [](Heartbeat& r) { r.set_worker_id("worker-7"); }, "worker_id",
            "\"worker-7\" is not a valid id (like \"worker-000007\""),
        BadHeartbeat(
            "HugeWorkerId", [](Heartbeat& r) { r.set_worker_id(std::string(100, '9')); },
            "worker_id", "100 bytes is longer than the limit of 64"),
        BadHeartbeat(
            "JobIdAsWorkerId", [](Heartbeat& r) { r.set_worker_id("job-000001"); }, "worker_id",
            "not a valid id"),
        BadHeartbeat(
            "BadStatusJobId", [](Heartbeat& r) { r.mutable_status()->set_job_id("job-1"); },
            "status.job_id", "not a valid id"),
        BadHeartbeat(
            "NegativeStatusGeneration",
            [](Heartbeat& r) { r.mutable_status()->set_generation(-1); }, "status.generation",
            "-1 must be >= 0"),
        BadHeartbeat(
            "NegativeStatusStep", [](Heartbeat& r) { r.mutable_status()->set_step(-5); },
            "status.step", "-5 must be >= 0"),
        BadHeartbeat(
            "StatusRankTooLarge", [](Heartbeat& r) { r.mutable_status()->set_rank(65536); },
            "status.rank", "65536 is out of range [0, 65535]"),
        BadHeartbeat(
            "OversizedRunError",
            [](Heartbeat& r) { r.mutable_status()->set_run_error(std::string(1025, 'e')); },
            "status.run_error", "1025 bytes is longer than the limit of 1024"),
        BadHeartbeat(
            "LostPeerRankTooLarge",
            [](Heartbeat& r) { r.mutable_status()->set_lost_peer_ranks(1, 65536); },
            "status.lost_peer_ranks[1]", "65536 is out of range [0, 65535]"),
        BadHeartbeat(
            "NegativeLostPeerRank",
            [](Heartbeat& r) { r.mutable_status()->set_lost_peer_ranks(0, -1); },
            "status.lost_peer_ranks[0]", "-1 is out of range [0, 65535]"),
        BadHeartbeat(
            "TooManyLostPeerRanks",
            [](Heartbeat& r) {
              r.mutable_status()->clear_lost_peer_ranks();
              for (int i = 0; i <= 65536; ++i) r.mutable_status()->add_lost_peer_ranks(i % 4);
            },
            "status.lost_peer_ranks", "65537 entries, more than the limit of 65536"),
        Bad<v1::LeaveWorkerRequest>(
            "LeaveWithBadId", ValidLeave, ValidateLeaveWorkerRequest,
            [](v1::LeaveWorkerRequest& r) { r.set_worker_id("w"); }, "worker_id", "not a valid id"),
        Bad<v1::ListWorkersRequest>(
            "UnknownWorkerState", ValidListWorkers, ValidateListWorkersRequest,
            [](v1::ListWorkersRequest& r) { r.set_state(static_cast<v1::WorkerState>(9)); },
            "state", "unknown WorkerState value 9"),
        Bad<v1::ListWorkersRequest>(
            "ZeroWorkerPageSize", ValidListWorkers, ValidateListWorkersRequest,
            [](v1::ListWorkersRequest& r) { r.set_page_size(0); }, "page_size",
            "0 is out of range [1, 1000]"),
        Bad<v1::ListWorkersRequest>(
            "HugeWorkerPageSize", ValidListWorkers, ValidateListWorkersRequest,
            [](v1::ListWorkersRequest& r) { r.set_page_size(1001); }, "page_size",
            "1001 is out of range"),
        Bad<v1::ListWorkersRequest>(
            "GarbageWorkerPageToken", ValidListWorkers, ValidateListWorkersRequest,
            [](v1::ListWorkersRequest& r) { r.set_page_token("worker-000007"); }, "page_token",
            "not a token from a previous ListWorkers reply"),
        Bad<v1::ListWorkersRequest>(
            "JobsPageTokenForWorkers", ValidListWorkers, ValidateListWorkersRequest,
            [](v1::ListWorkersRequest& r) { r.set_page_token(MakePageToken("job-000001")); },
            "page_token", "not a token from a previous ListWorkers reply")),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Jobs, BadRequestTest,
    ::testing::Values(
        Bad<v1::SubmitJobRequest>(
            "NoSpec", ValidSubmit, ValidateSubmitJobRequest,
            [](v1::SubmitJobRequest& r) { r.clear_spec(); }, "spec", "required"),
        Bad<v1::SubmitJobRequest>(
            "NaNLr", ValidSubmit, ValidateSubmitJobRequest,
            [](v1::SubmitJobRequest& r) { r.mutable_spec()->mutable_optimizer()->set_lr(kNaN); },
            "spec.optimizer.lr", "NaN is not allowed"),
        // Fails before the fix: gather_pool_buckets did not exist. (ZERO3 itself is accepted.)
        Bad<v1::SubmitJobRequest>(
            "GatherPoolBucketsOnZero2", ValidSubmit, ValidateSubmitJobRequest,
            [](v1::SubmitJobRequest& r) {
              r.mutable_spec()->set_mode(v1::ZERO2);
              r.mutable_spec()->set_gather_pool_buckets(4);
            },
            "spec.gather_pool_buckets", "only applies to mode ZERO3"),
        Bad<v1::SubmitJobRequest>(
            "NoName", ValidSubmit, ValidateSubmitJobRequest,
            [](v1::SubmitJobRequest& r) { r.mutable_spec()->clear_name(); }, "spec.name",
            "must be 1 to 63 characters"),
        Bad<v1::SubmitJobRequest>(
            "MomentumOnAdam", ValidSubmit, ValidateSubmitJobRequest,
            [](v1::SubmitJobRequest& r) {
              r.mutable_spec()->mutable_optimizer()->set_kind(v1::ADAM);
              r.mutable_spec()->mutable_optimizer()->set_momentum(0.9);
            },
            "spec.optimizer.momentum", "only applies to SGD"),
        Bad<v1::GetJobRequest>(
            "NoJobId", ValidGetJob, ValidateGetJobRequest,
            [](v1::GetJobRequest& r) { r.clear_job_id(); }, "job_id", "required"),
        Bad<v1::GetJobRequest>(
            "ShortJobId", ValidGetJob, ValidateGetJobRequest,
            [](v1::GetJobRequest& r) { r.set_job_id("job-42"); }, "job_id",
            "\"job-42\" is not a valid id (like \"job-000042\""),
        Bad<v1::GetJobRequest>(
            "JobIdAndRunKey", ValidGetJob, ValidateGetJobRequest,
            [](v1::GetJobRequest& r) { r.set_run_key("abc-1"); }, "job_id, run_key",
            "set one of them, not both"),
        Bad<v1::GetJobRequest>(
            "RunKeyNotAName", ValidGetJob, ValidateGetJobRequest,
            [](v1::GetJobRequest& r) {
              r.clear_job_id();
              r.set_run_key("Abc/1");
            },
            "run_key", "characters of [a-z0-9-]"),
        Bad<v1::GetJobRequest>(
            "JobIdWithNul", ValidGetJob, ValidateGetJobRequest,
            [](v1::GetJobRequest& r) { r.set_job_id(std::string("job-000042\0", 11)); }, "job_id",
            "not a valid id"),
        Bad<v1::ListJobsRequest>(
            "UnknownJobState", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) { r.set_state(static_cast<v1::JobState>(77)); }, "state",
            "unknown JobState value 77"),
        Bad<v1::ListJobsRequest>(
            "ZeroLimit", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) { r.set_limit(0); }, "limit", "0 is out of range [1, 1000]"),
        Bad<v1::ListJobsRequest>(
            "HugeLimit", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) { r.set_limit(1001); }, "limit", "1001 is out of range"),
        Bad<v1::ListJobsRequest>(
            "NegativeLimit", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) { r.set_limit(-1); }, "limit", "-1 is out of range"),
        Bad<v1::ListJobsRequest>(
            "PageSizeAndLimit", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) { r.set_page_size(10); }, "page_size",
            "set page_size or limit (its older name), not both"),
        Bad<v1::ListJobsRequest>(
            "HugeJobPageSize", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) {
              r.clear_limit();
              r.set_page_size(1001);
            },
            "page_size", "1001 is out of range"),
        Bad<v1::ListJobsRequest>(
            "GarbageJobPageToken", ValidListJobs, ValidateListJobsRequest,
            [](v1::ListJobsRequest& r) { r.set_page_token("%%%"); }, "page_token",
            "not a token from a previous ListJobs reply"),
        Bad<v1::CancelJobRequest>(
            "CancelBadId", ValidCancel, ValidateCancelJobRequest,
            [](v1::CancelJobRequest& r) { r.set_job_id("JOB-000042"); }, "job_id",
            "not a valid id"),
        Bad<v1::CancelJobRequest>(
            "LongReason", ValidCancel, ValidateCancelJobRequest,
            [](v1::CancelJobRequest& r) { r.set_reason(std::string(1025, 'r')); }, "reason",
            "1025 bytes is longer than the limit of 1024"),
        Bad<v1::WatchJobRequest>(
            "NegativeAfterSequence", ValidWatch, ValidateWatchJobRequest,
            [](v1::WatchJobRequest& r) { r.set_after_sequence(-1); }, "after_sequence",
            "-1 must be >= 0"),
        Bad<v1::WatchJobRequest>(
            "WatchWithoutJob", ValidWatch, ValidateWatchJobRequest,
            [](v1::WatchJobRequest& r) { r.clear_job_id(); }, "job_id", "required"),
        Bad<v1::GetShardPlanRequest>(
            "NegativePlanGeneration", ValidGetShardPlan, ValidateGetShardPlanRequest,
            [](v1::GetShardPlanRequest& r) { r.set_generation(-1); }, "generation",
            "-1 must be >= 0"),
        Bad<v1::GetShardPlanRequest>(
            "NegativeRank", ValidGetShardPlan, ValidateGetShardPlanRequest,
            [](v1::GetShardPlanRequest& r) { r.set_rank(-1); }, "rank",
            "-1 is out of range [0, 65535]"),
        Bad<v1::GetShardPlanRequest>(
            "RankBeyondAnyWorldSize", ValidGetShardPlan, ValidateGetShardPlanRequest,
            [](v1::GetShardPlanRequest& r) { r.set_rank(65536); }, "rank",
            "65536 is out of range")),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Store, BadRequestTest,
    ::testing::Values(
        Bad<v1::StoreSetRequest>(
            "SetZeroGeneration", ValidStoreSet, ValidateStoreSetRequest,
            [](v1::StoreSetRequest& r) { r.set_generation(0); }, "generation", "0 must be >= 1"),
        Bad<v1::StoreSetRequest>(
            "SetNegativeGeneration", ValidStoreSet, ValidateStoreSetRequest,
            [](v1::StoreSetRequest& r) { r.set_generation(std::numeric_limits<int64_t>::min()); },
            "generation", "must be >= 1"),
        Bad<v1::StoreSetRequest>(
            "SetEmptyKey", ValidStoreSet, ValidateStoreSetRequest,
            [](v1::StoreSetRequest& r) { r.clear_key(); }, "key", "required"),
        Bad<v1::StoreSetRequest>(
            "SetLongKey", ValidStoreSet, ValidateStoreSetRequest,
            [](v1::StoreSetRequest& r) { r.set_key(std::string(513, 'k')); }, "key",
            "513 bytes is longer than the limit of 512"),
        Bad<v1::StoreSetRequest>(
            "SetHugeValue", ValidStoreSet, ValidateStoreSetRequest,
            [](v1::StoreSetRequest& r) { r.set_value(std::string((size_t{1} << 20) + 1, 'v')); },
            "value", "1048577 bytes is longer than the limit of 1048576"),
        Bad<v1::StoreSetRequest>(
            "SetBadJobId", ValidStoreSet, ValidateStoreSetRequest,
            [](v1::StoreSetRequest& r) { r.set_job_id("job-x"); }, "job_id", "not a valid id"),
        Bad<v1::StoreGetRequest>(
            "GetNegativeTimeout", ValidStoreGet, ValidateStoreGetRequest,
            [](v1::StoreGetRequest& r) { r.set_timeout_ms(-1); }, "timeout_ms",
            "-1 is out of range [0, 600000]"),
        Bad<v1::StoreGetRequest>(
            "GetHugeTimeout", ValidStoreGet, ValidateStoreGetRequest,
            [](v1::StoreGetRequest& r) { r.set_timeout_ms(600001); }, "timeout_ms",
            "600001 is out of range"),
        Bad<v1::StoreGetRequest>(
            "GetEmptyKey", ValidStoreGet, ValidateStoreGetRequest,
            [](v1::StoreGetRequest& r) { r.clear_key(); }, "key", "required"),
        Bad<v1::StoreAddRequest>(
            "AddZeroGeneration", ValidStoreAdd, ValidateStoreAddRequest,
            [](v1::StoreAddRequest& r) { r.set_generation(0); }, "generation", "must be >= 1"),
        Bad<v1::StoreAddRequest>(
            "AddLongKey", ValidStoreAdd, ValidateStoreAddRequest,
            [](v1::StoreAddRequest& r) { r.set_key(std::string(1000, 'k')); }, "key",
            "longer than the limit of 512"),
        Bad<v1::StoreDeleteRequest>(
            "DeleteEmptyKey", ValidStoreDelete, ValidateStoreDeleteRequest,
            [](v1::StoreDeleteRequest& r) { r.clear_key(); }, "key", "required"),
        Bad<v1::StoreDeleteRequest>(
            "DeleteWorkerIdAsJobId", ValidStoreDelete, ValidateStoreDeleteRequest,
            [](v1::StoreDeleteRequest& r) { r.set_job_id("worker-000001"); }, "job_id",
            "not a valid id")),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Progress, BadRequestTest,
    ::testing::Values(
        BadProgress(
            "ProgressBadWorkerId", [](Progress& r) { r.set_worker_id("worker-00000a"); },
            "worker_id", "not a valid id"),
        BadProgress(
            "ProgressNoJobId", [](Progress& r) { r.clear_job_id(); }, "job_id", "required"),
        BadProgress(
            "ProgressLongNotice", [](Progress& r) { r.set_notice(std::string(4097, 'n')); },
            "notice", "4096"),
        BadProgress(
            "ProgressZeroGeneration", [](Progress& r) { r.set_generation(0); }, "generation",
            "0 must be >= 1"),
        BadProgress(
            "ProgressNegativeRank", [](Progress& r) { r.set_rank(-2); }, "rank",
            "-2 is out of range"),
        BadProgress(
            "NoMetrics", [](Progress& r) { r.clear_metrics(); }, "metrics", "required"),
        BadProgress(
            "NegativeStep", [](Progress& r) { r.mutable_metrics()->set_step(-1); }, "metrics.step",
            "-1 must be >= 0"),
        BadProgress(
            "NaNLoss", [](Progress& r) { r.mutable_metrics()->set_loss(kNaN); }, "metrics.loss",
            "NaN is not allowed"),
        BadProgress(
            "InfLoss", [](Progress& r) { r.mutable_metrics()->set_loss(kInf); }, "metrics.loss",
            "Inf is not allowed"),
        BadProgress(
            "NaNStepMs", [](Progress& r) { r.mutable_metrics()->set_step_ms(kNaN); },
            "metrics.step_ms", "metrics.step_ms: NaN is not allowed"),
        BadProgress(
            "NegativeStepMs", [](Progress& r) { r.mutable_metrics()->set_step_ms(-1); },
            "metrics.step_ms", "-1 is negative"),
        BadProgress(
            "InfCommMs", [](Progress& r) { r.mutable_metrics()->set_comm_ms(kInf); },
            "metrics.comm_ms", "Inf is not allowed"),
        BadProgress(
            "NegativeExposedCommMs",
            [](Progress& r) { r.mutable_metrics()->set_exposed_comm_ms(-0.5); },
            "metrics.exposed_comm_ms", "-0.5 is negative"),
        BadProgress(
            "NaNUpdateMs", [](Progress& r) { r.mutable_metrics()->set_update_ms(kNaN); },
            "metrics.update_ms", "NaN"),
        BadProgress(
            "MinusInfAllgatherMs",
            [](Progress& r) { r.mutable_metrics()->set_allgather_ms(-kInf); },
            "metrics.allgather_ms", "-Inf is not allowed"),
        BadProgress(
            "NegativeGradNorm", [](Progress& r) { r.mutable_metrics()->set_grad_norm(-1); },
            "metrics.grad_norm", "-1 is negative"),
        BadProgress(
            "NaNGradNormOnAStepTaken",
            [](Progress& r) { r.mutable_metrics()->set_grad_norm(kNaN); }, "metrics.grad_norm",
            "NaN is not allowed"),
        BadProgress(
            "NegativeGradNormOnASkippedStep",
            [](Progress& r) {
              r.mutable_metrics()->set_skipped(true);
              r.mutable_metrics()->set_grad_norm(-3);
            },
            "metrics.grad_norm", "-3 is negative"),
        BadProgress(
            "ZeroLossScale", [](Progress& r) { r.mutable_metrics()->set_loss_scale(0); },
            "metrics.loss_scale", "0 must be > 0"),
        BadProgress(
            "NaNLossScale", [](Progress& r) { r.mutable_metrics()->set_loss_scale(kNaN); },
            "metrics.loss_scale", "NaN is not allowed"),
        BadProgress(
            "NegativeParamsBytes",
            [](Progress& r) { r.mutable_metrics()->mutable_memory()->set_params_bytes(-1); },
            "metrics.memory.params_bytes", "-1 must be >= 0"),
        BadProgress(
            "NegativeOptimizerStateBytes",
            [](Progress& r) {
              r.mutable_metrics()->mutable_memory()->set_optimizer_state_bytes(-8);
            },
            "metrics.memory.optimizer_state_bytes", "-8 must be >= 0"),
        BadProgress(
            "NegativeTotalBytes",
            [](Progress& r) { r.mutable_metrics()->mutable_memory()->set_total_bytes(-1); },
            "metrics.memory.total_bytes", "must be >= 0"),
        // Fails before the fix: gather_pool_bytes did not exist and was not checked.
        BadProgress(
            "NegativeGatherPoolBytes",
            [](Progress& r) { r.mutable_metrics()->mutable_memory()->set_gather_pool_bytes(-3); },
            "metrics.memory.gather_pool_bytes", "-3 must be >= 0"),
        BadProgress(
            "NegativeWorkloadBytes",
            [](Progress& r) { r.mutable_metrics()->mutable_memory()->set_workload_bytes(-4); },
            "metrics.memory.workload_bytes", "-4 must be >= 0"),
        BadProgress(
            "NegativeCommStagingBytes",
            [](Progress& r) { r.mutable_metrics()->mutable_memory()->set_comm_staging_bytes(-2); },
            "metrics.memory.comm_staging_bytes", "-2 must be >= 0"),
        BadProgress(
            "NegativeIterationMs", [](Progress& r) { r.mutable_metrics()->set_iteration_ms(-1); },
            "metrics.iteration_ms", "-1 is negative"),
        BadProgress(
            "InfiniteComputeMs", [](Progress& r) { r.mutable_metrics()->set_compute_ms(kInf); },
            "metrics.compute_ms", "not allowed"),
        BadProgress(
            "NegativeParamWaitMs",
            [](Progress& r) { r.mutable_metrics()->set_param_wait_ms(-0.5); },
            "metrics.param_wait_ms", "is negative"),
        BadProgress(
            "NegativeVmHwm", [](Progress& r) { r.mutable_metrics()->set_vmhwm_bytes(-1); },
            "metrics.vmhwm_bytes", "-1 must be >= 0"),
        BadProgress(
            "NegativeBucketExposure",
            [](Progress& r) { r.mutable_metrics()->set_bucket_exposed_ms(1, -1); },
            "metrics.bucket_exposed_ms[1]", "-1 is negative"),
        BadProgress(
            "NaNBucketExposureInBackward",
            [](Progress& r) { r.mutable_metrics()->set_bucket_exposed_in_backward_ms(2, kNaN); },
            "metrics.bucket_exposed_in_backward_ms[2]", "NaN is not allowed"),
        BadProgress(
            "TooManyBuckets",
            [](Progress& r) {
              for (int b = 0; b < jobspec::kMaxReportedBuckets; ++b) {
                r.mutable_metrics()->add_bucket_exposed_ms(0);
                r.mutable_metrics()->add_bucket_exposed_in_backward_ms(0);
              }
            },
            "metrics.bucket_exposed_ms", "4099 entries is more than the limit of 4096"),
        BadProgress(
            "BucketCountsDisagree",
            [](Progress& r) { r.mutable_metrics()->add_bucket_exposed_in_backward_ms(0); },
            "metrics.bucket_exposed_in_backward_ms", "4 entries, but bucket_exposed_ms has 3"),
        BadProgress(
            "MoreInBackwardThanInAll",
            [](Progress& r) { r.mutable_metrics()->set_bucket_exposed_in_backward_ms(1, 3); },
            "metrics.bucket_exposed_in_backward_ms[1]",
            "3 is more than bucket_exposed_ms[1] (2.5)"),
        BadProgress(
            "NegativeCommThreadCpu",
            [](Progress& r) { r.mutable_metrics()->set_comm_thread_cpu_ms(-1); },
            "metrics.comm_thread_cpu_ms", "-1 is negative"),
        BadProgress(
            "InfiniteComputeThreadCpu",
            [](Progress& r) { r.mutable_metrics()->set_compute_thread_cpu_ms(kInf); },
            "metrics.compute_thread_cpu_ms", "Inf is not allowed"),
        BadProgress(
            "NaNProcessCpu", [](Progress& r) { r.mutable_metrics()->set_process_cpu_ms(kNaN); },
            "metrics.process_cpu_ms", "NaN is not allowed")),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, BadRequestTest,
    ::testing::Values(
        BadCommit(
            "CommitNoWorkerId", [](Commit& r) { r.clear_worker_id(); }, "worker_id", "required"),
        BadCommit(
            "CommitUnknownOutcome",
            [](Commit& r) { r.set_outcome(static_cast<v1::CheckpointOutcome>(7)); }, "outcome",
            "unknown value 7"),
        BadCommit(
            "CommitLongMessage",
            [](Commit& r) {
              r.set_outcome(v1::CHECKPOINT_FAILED);
              r.set_message(std::string(1025, 'x'));
            },
            "message", "1024"),
        BadCommit(
            "CommitLongPathOnAFailure",
            [](Commit& r) {
              r.set_outcome(v1::CHECKPOINT_FAILED);
              r.set_path(std::string(4097, 'p'));
            },
            "path", "4097 bytes is longer than the limit of 4096"),
        BadCommit(
            "CommitBadJobId", [](Commit& r) { r.set_job_id("job-000042/.."); }, "job_id",
            "not a valid id"),
        BadCommit(
            "CommitZeroGeneration", [](Commit& r) { r.set_generation(0); }, "generation",
            "must be >= 1"),
        BadCommit(
            "CommitNegativeRank", [](Commit& r) { r.set_rank(-1); }, "rank", "out of range"),
        BadCommit(
            "CommitNegativeStep", [](Commit& r) { r.set_step(-1); }, "step", "-1 must be >= 0"),
        BadCommit(
            "CommitNoPath", [](Commit& r) { r.clear_path(); }, "path", "required"),
        BadCommit(
            "CommitAbsolutePath", [](Commit& r) { r.set_path("/etc/passwd"); }, "path",
            "must be relative and must not contain \"..\""),
        BadCommit(
            "CommitEscapingPath", [](Commit& r) { r.set_path("../../x"); }, "path",
            "\"..\" component"),
        BadCommit(
            "CommitEmptyComponent", [](Commit& r) { r.set_path("a//b"); }, "path", "empty"),
        BadCommit(
            "CommitHugePath", [](Commit& r) { r.set_path(std::string(4097, 'p')); }, "path",
            "4097 bytes is longer than the limit of 4096"),
        BadCommit(
            "CommitPathWithNul", [](Commit& r) { r.set_path(std::string("a\0/b", 4)); }, "path",
            "control character"),
        BadCommit(
            "CommitNegativeBytes", [](Commit& r) { r.set_bytes(-1); }, "bytes", "-1 must be >= 0"),
        Bad<v1::RewindJobRequest>(
            "RewindNoWorkerId", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.clear_worker_id(); }, "worker_id", "required"),
        Bad<v1::RewindJobRequest>(
            "RewindZeroGeneration", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.set_generation(0); }, "generation", "must be >= 1"),
        Bad<v1::RewindJobRequest>(
            "RewindNegativeStep", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.set_step(-1); }, "step", "-1 must be >= 0"),
        Bad<v1::RewindJobRequest>(
            "RewindHugeStep", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.set_step(int64_t{1000000000000}); }, "step",
            "must be < 1000000000000"),
        Bad<v1::RewindJobRequest>(
            "RewindLoadedCheckpointWithoutJob", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.clear_loaded_job_id(); }, "loaded_job_id", "required"),
        Bad<v1::RewindJobRequest>(
            "RewindLongLoadedJobId", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.set_loaded_job_id(std::string(257, 'j')); },
            "loaded_job_id", "257 bytes is longer than the limit of 256"),
        Bad<v1::RewindJobRequest>(
            "RewindNegativeLoadedStep", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.mutable_loaded_checkpoint()->set_step(-3); },
            "loaded_checkpoint.step", "-3 must be >= 0"),
        Bad<v1::RewindJobRequest>(
            "RewindLongReason", ValidRewind, ValidateRewindJobRequest,
            [](v1::RewindJobRequest& r) { r.set_reason(std::string(1025, 'r')); }, "reason",
            "1024"),
        Bad<v1::ExportCheckpointRequest>(
            "ExportNoJobId", ValidExport, ValidateExportCheckpointRequest,
            [](v1::ExportCheckpointRequest& r) { r.clear_job_id(); }, "job_id", "required"),
        Bad<v1::ExportCheckpointRequest>(
            "ExportBadJobId", ValidExport, ValidateExportCheckpointRequest,
            [](v1::ExportCheckpointRequest& r) { r.set_job_id("../job-000042"); }, "job_id",
            "not a valid id"),
        Bad<v1::ExportCheckpointRequest>(
            "ExportNegativeStep", ValidExport, ValidateExportCheckpointRequest,
            [](v1::ExportCheckpointRequest& r) { r.set_step(-1); }, "step", "-1 must be >= 0"),
        Bad<v1::VerifyCheckpointRequest>(
            "VerifyNoJobId", ValidVerify, ValidateVerifyCheckpointRequest,
            [](v1::VerifyCheckpointRequest& r) { r.clear_job_id(); }, "job_id", "required"),
        Bad<v1::VerifyCheckpointRequest>(
            "VerifyBadJobId", ValidVerify, ValidateVerifyCheckpointRequest,
            [](v1::VerifyCheckpointRequest& r) { r.set_job_id("job-1/../x"); }, "job_id",
            "not a valid id"),
        Bad<v1::VerifyCheckpointRequest>(
            "VerifyNegativeStep", ValidVerify, ValidateVerifyCheckpointRequest,
            [](v1::VerifyCheckpointRequest& r) { r.set_step(-1); }, "step", "-1 must be >= 0")),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

TEST(RequestValidationTest, LabelErrorsComeInKeyOrder) {
  v1::RegisterWorkerRequest request = ValidRegister();
  (*request.mutable_labels())["b"] = std::string(300, 'v');
  (*request.mutable_labels())["a"] = std::string(300, 'v');
  (*request.mutable_labels())["c"] = std::string(300, 'v');
  EXPECT_TRUE(
      absl::StartsWith(ValidateRegisterWorkerRequest(request).message(), "labels[\"a\"]: "));
}

TEST(RequestValidationTest, FirstErrorInFieldOrderWins) {
  v1::CommitCheckpointRequest request = ValidCommit();
  request.set_bytes(-1);
  request.set_path("/abs");
  request.set_generation(0);
  EXPECT_TRUE(absl::StartsWith(ValidateCommitCheckpointRequest(request).message(), "generation: "));
}

}  // namespace
}  // namespace zeroshard::coordinator
