// Shape validation of Coordinator RPC requests: field by field, in proto order.
#include "coordinator/request_validation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "coordinator/page_token.h"
#include "jobspec/job_plan.h"
#include "jobspec/job_spec_defaults.h"
#include "jobspec/job_spec_validation.h"
#include "jobspec/job_spec_validation_checks.h"
#include "sharding/shard_planner.h"

namespace zeroshard::coordinator {
namespace {

// CommitCheckpointRequest.message: an error text, not a log.
constexpr size_t kMaxCheckpointMessageBytes = 1024;
// ReportProgressRequest.notice: a few lines for the job's owner.
constexpr size_t kMaxNoticeBytes = 4096;
// RewindJobRequest: a step a checkpoint directory name holds in 12 digits; a job id another
// job's checkpoint names (not necessarily this coordinator's format).
constexpr int64_t kMaxRewindStep = int64_t{1000000000000};
constexpr size_t kMaxLoadedJobIdBytes = 256;

absl::Status Required(absl::string_view field) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
}

absl::Status CheckAtLeast(absl::string_view field, int64_t value, int64_t minimum) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " must be >= ", minimum));
}

absl::Status CheckNonNegative(absl::string_view field, int64_t value) {
  return CheckAtLeast(field, value, 0);
}

absl::Status CheckId(absl::string_view field, absl::string_view id,
                     bool (*is_valid)(absl::string_view), absl::string_view example) {
  if (id.empty()) return Required(field);
  ZS_RETURN_IF_ERROR(jobspec::CheckMaxBytes(field, id, kMaxIdLength));
  if (is_valid(id)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", jobspec::Quote(id),
                                                 " is not a valid id (like \"", example,
                                                 "\": a prefix and 6 or more digits)"));
}

absl::Status CheckWorkerId(absl::string_view field, absl::string_view id) {
  return CheckId(field, id, IsValidWorkerId, FormatWorkerId(7));
}

absl::Status CheckJobId(absl::string_view field, absl::string_view id) {
  return CheckId(field, id, IsValidJobId, FormatJobId(42));
}

// A live store namespace belongs to a started generation, so 0 (and below) never names one.
absl::Status CheckStoreScope(absl::string_view job_id, int64_t generation) {
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", job_id));
  return CheckAtLeast("generation", generation, 1);
}

absl::Status CheckStoreKey(absl::string_view key) {
  if (key.empty()) return Required("key");
  return jobspec::CheckMaxBytes("key", key, kMaxStoreKeyBytes);
}

absl::Status CheckRank(int32_t rank) {
  return jobspec::CheckIntInRange("rank", rank, 0, sharding::kMaxWorldSize - 1);
}

bool IsHostChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-'; }

bool IsLabelKeyChar(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.' || c == '_' ||
         c == '/';
}

absl::Status CheckHost(absl::string_view host) {
  if (!host.empty() && host.size() <= kMaxHostLength && absl::c_all_of(host, IsHostChar)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("host: ", jobspec::Quote(host), " must be 1 to ",
                                                 kMaxHostLength, " characters of [A-Za-z0-9.-]"));
}

absl::Status CheckLabels(const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.size() > static_cast<size_t>(kMaxWorkerLabels)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "labels: ", labels.size(), " labels is more than the limit of ", kMaxWorkerLabels));
  }
  // Map order is unspecified; sorted keys make the first error deterministic.
  std::vector<std::string> keys;
  for (const auto& [key, value] : labels) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (const std::string& key : keys) {
    if (key.empty() || key.size() > kMaxLabelKeyLength || !absl::c_all_of(key, IsLabelKeyChar)) {
      return absl::InvalidArgumentError(absl::StrCat("labels: key ", jobspec::Quote(key),
                                                     " must be 1 to ", kMaxLabelKeyLength,
                                                     " characters of [a-z0-9-._/]"));
    }
    ZS_RETURN_IF_ERROR(jobspec::CheckMaxBytes(absl::StrCat("labels[", jobspec::Quote(key), "]"),
                                              labels.at(key), kMaxLabelValueBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckMemory(const v1::MemoryBreakdown& memory) {
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.params_bytes", memory.params_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.grads_bytes", memory.grads_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.master_bytes", memory.master_bytes()));
  ZS_RETURN_IF_ERROR(
      CheckNonNegative("metrics.memory.optimizer_state_bytes", memory.optimizer_state_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.bucket_bytes", memory.bucket_bytes()));
  ZS_RETURN_IF_ERROR(
      CheckNonNegative("metrics.memory.comm_scratch_bytes", memory.comm_scratch_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.total_bytes", memory.total_bytes()));
  ZS_RETURN_IF_ERROR(
      CheckNonNegative("metrics.memory.comm_staging_bytes", memory.comm_staging_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.workload_bytes", memory.workload_bytes()));
  ZS_RETURN_IF_ERROR(
      CheckNonNegative("metrics.memory.kernel_tables_bytes", memory.kernel_tables_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.memory.checkpoint_staging_bytes",
                                      memory.checkpoint_staging_bytes()));
  return CheckNonNegative("metrics.memory.gather_pool_bytes", memory.gather_pool_bytes());
}

// At most kMaxReportedBuckets entries, each finite and >= 0; errors name the entry
// ("metrics.bucket_exposed_ms[3]: -1 is negative").
absl::Status CheckBucketFigures(absl::string_view field,
                                const google::protobuf::RepeatedField<double>& values) {
  if (values.size() > jobspec::kMaxReportedBuckets) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", values.size(),
                                                   " entries is more than the limit of ",
                                                   jobspec::kMaxReportedBuckets));
  }
  for (int i = 0; i < values.size(); ++i) {
    ZS_RETURN_IF_ERROR(
        jobspec::CheckFiniteNonNegative(absl::StrCat(field, "[", i, "]"), values[i]));
  }
  return absl::OkStatus();
}

absl::Status CheckBucketExposure(const v1::StepMetrics& metrics) {
  ZS_RETURN_IF_ERROR(CheckBucketFigures("metrics.bucket_exposed_ms", metrics.bucket_exposed_ms()));
  ZS_RETURN_IF_ERROR(CheckBucketFigures("metrics.bucket_exposed_in_backward_ms",
                                        metrics.bucket_exposed_in_backward_ms()));
  const auto& total = metrics.bucket_exposed_ms();
  const auto& in_backward = metrics.bucket_exposed_in_backward_ms();
  if (in_backward.size() != total.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.bucket_exposed_in_backward_ms: ", in_backward.size(),
                     " entries, but bucket_exposed_ms has ", total.size()));
  }
  for (int i = 0; i < total.size(); ++i) {
    if (in_backward[i] > total[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics.bucket_exposed_in_backward_ms[", i, "]: ", jobspec::FormatDouble(in_backward[i]),
          " is more than bucket_exposed_ms[", i, "] (", jobspec::FormatDouble(total[i]), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMetrics(const v1::StepMetrics& metrics) {
  const bool skipped = metrics.skipped();
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.step", metrics.step()));
  // A step skipped for a non-finite gradient may have a non-finite loss and gradient norm.
  if (!skipped) ZS_RETURN_IF_ERROR(jobspec::CheckFinite("metrics.loss", metrics.loss()));
  ZS_RETURN_IF_ERROR(jobspec::CheckFiniteNonNegative("metrics.step_ms", metrics.step_ms()));
  ZS_RETURN_IF_ERROR(jobspec::CheckFiniteNonNegative("metrics.comm_ms", metrics.comm_ms()));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckFiniteNonNegative("metrics.exposed_comm_ms", metrics.exposed_comm_ms()));
  ZS_RETURN_IF_ERROR(jobspec::CheckFiniteNonNegative("metrics.update_ms", metrics.update_ms()));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckFiniteNonNegative("metrics.allgather_ms", metrics.allgather_ms()));
  if (!skipped || std::isfinite(metrics.grad_norm())) {
    ZS_RETURN_IF_ERROR(jobspec::CheckFiniteNonNegative("metrics.grad_norm", metrics.grad_norm()));
  }
  ZS_RETURN_IF_ERROR(jobspec::CheckFinite("metrics.loss_scale", metrics.loss_scale()));
  if (metrics.loss_scale() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.loss_scale: ", jobspec::FormatDouble(metrics.loss_scale()), " must be > 0"));
  }
  ZS_RETURN_IF_ERROR(CheckMemory(metrics.memory()));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckFiniteNonNegative("metrics.iteration_ms", metrics.iteration_ms()));
  ZS_RETURN_IF_ERROR(jobspec::CheckFiniteNonNegative("metrics.compute_ms", metrics.compute_ms()));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckFiniteNonNegative("metrics.param_wait_ms", metrics.param_wait_ms()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.vmhwm_bytes", metrics.vmhwm_bytes()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("metrics.vmrss_bytes", metrics.vmrss_bytes()));
  ZS_RETURN_IF_ERROR(
      CheckNonNegative("metrics.vmrss_at_start_bytes", metrics.vmrss_at_start_bytes()));
  ZS_RETURN_IF_ERROR(CheckBucketExposure(metrics));
  ZS_RETURN_IF_ERROR(jobspec::CheckFiniteNonNegative("metrics.compute_thread_cpu_ms",
                                                     metrics.compute_thread_cpu_ms()));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckFiniteNonNegative("metrics.comm_thread_cpu_ms", metrics.comm_thread_cpu_ms()));
  return jobspec::CheckFiniteNonNegative("metrics.process_cpu_ms", metrics.process_cpu_ms());
}

// A worker's status, on heartbeats and registrations; `status.job_id` may be empty (idle).
absl::Status CheckWorkerStatus(const v1::WorkerStatus& status) {
  if (!status.job_id().empty()) ZS_RETURN_IF_ERROR(CheckJobId("status.job_id", status.job_id()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("status.generation", status.generation()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("status.step", status.step()));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckMaxBytes("status.run_error", status.run_error(), kMaxRunErrorBytes));
  ZS_RETURN_IF_ERROR(
      jobspec::CheckIntInRange("status.rank", status.rank(), 0, sharding::kMaxWorldSize - 1));
  if (status.lost_peer_ranks_size() > sharding::kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("status.lost_peer_ranks: ", status.lost_peer_ranks_size(),
                     " entries, more than the limit of ", sharding::kMaxWorldSize));
  }
  for (int i = 0; i < status.lost_peer_ranks_size(); ++i) {
    ZS_RETURN_IF_ERROR(jobspec::CheckIntInRange(absl::StrCat("status.lost_peer_ranks[", i, "]"),
                                                status.lost_peer_ranks(i), 0,
                                                sharding::kMaxWorldSize - 1));
  }
  return absl::OkStatus();
}

// Empty (no attached trainers), or a path a trainer on the worker's host can connect to.
absl::Status CheckAttachSocket(absl::string_view path) {
  if (path.empty()) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(jobspec::CheckMaxBytes("attach_socket", path, kMaxAttachSocketBytes));
  if (absl::c_any_of(path, [](char c) { return absl::ascii_iscntrl(c); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach_socket: ", jobspec::Quote(path), " contains a control character"));
  }
  if (path.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("attach_socket: ", jobspec::Quote(path),
                     " is not an absolute path (it must start with /)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRegisterWorkerRequest(const v1::RegisterWorkerRequest& request) {
  ZS_RETURN_IF_ERROR(jobspec::CheckName("name", request.name()));
  ZS_RETURN_IF_ERROR(CheckHost(request.host()));
  ZS_RETURN_IF_ERROR(jobspec::CheckEnumIn("device_kind", *v1::DeviceKind_descriptor(),
                                          request.device_kind(), {v1::CPU, v1::CUDA}));
  ZS_RETURN_IF_ERROR(jobspec::CheckIntInRange("device_memory_bytes", request.device_memory_bytes(),
                                              0, kMaxDeviceMemoryBytes));
  ZS_RETURN_IF_ERROR(jobspec::CheckIntInRange("memory_limit_bytes", request.memory_limit_bytes(), 0,
                                              kMaxMemoryLimitBytes));
  ZS_RETURN_IF_ERROR(CheckLabels(request.labels()));
  if (!request.previous_worker_id().empty()) {
    ZS_RETURN_IF_ERROR(CheckWorkerId("previous_worker_id", request.previous_worker_id()));
  } else if (!request.status().job_id().empty()) {
    // A run can only be adopted by the worker that held its rank.
    return absl::InvalidArgumentError("previous_worker_id: required when status.job_id is set");
  }
  ZS_RETURN_IF_ERROR(CheckWorkerStatus(request.status()));
  return CheckAttachSocket(request.attach_socket());
}

absl::Status ValidateHeartbeatRequest(const v1::HeartbeatRequest& request) {
  ZS_RETURN_IF_ERROR(CheckWorkerId("worker_id", request.worker_id()));
  return CheckWorkerStatus(request.status());
}

absl::Status ValidateLeaveWorkerRequest(const v1::LeaveWorkerRequest& request) {
  return CheckWorkerId("worker_id", request.worker_id());
}

absl::Status ValidateListWorkersRequest(const v1::ListWorkersRequest& request) {
  ZS_RETURN_IF_ERROR(
      jobspec::CheckEnumIn("state", *v1::WorkerState_descriptor(), request.state(),
                           {v1::WORKER_STATE_UNSPECIFIED, v1::IDLE, v1::BUSY, v1::DEAD, v1::LEFT}));
  if (request.has_page_size()) {
    ZS_RETURN_IF_ERROR(
        jobspec::CheckIntInRange("page_size", request.page_size(), 1, kMaxListPageSize));
  }
  if (!request.page_token().empty()) {
    ZS_RETURN_IF_ERROR(ParseWorkerPageToken(request.page_token()).status());
  }
  return absl::OkStatus();
}

absl::Status ValidateSubmitJobRequest(const v1::SubmitJobRequest& request) {
  if (!request.has_spec()) return Required("spec");
  const absl::Status status = jobspec::ValidateJobSpec(jobspec::WithDefaults(request.spec()));
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("spec.", status.message()));
}

absl::Status ValidateGetJobRequest(const v1::GetJobRequest& request) {
  if (!request.run_key().empty()) {
    if (!request.job_id().empty()) {
      return absl::InvalidArgumentError("job_id, run_key: set one of them, not both");
    }
    return jobspec::CheckName("run_key", request.run_key());
  }
  return CheckJobId("job_id", request.job_id());
}

absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request) {
  ZS_RETURN_IF_ERROR(
      jobspec::CheckEnumIn("state", *v1::JobState_descriptor(), request.state(),
                           {v1::JOB_STATE_UNSPECIFIED, v1::PENDING, v1::RUNNING, v1::RECOVERING,
                            v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}));
  if (request.has_limit()) {
    ZS_RETURN_IF_ERROR(jobspec::CheckIntInRange("limit", request.limit(), 1, kMaxListJobsLimit));
  }
  if (request.has_page_size()) {
    if (request.has_limit()) {
      return absl::InvalidArgumentError(
          "page_size: set page_size or limit (its older name), not both");
    }
    ZS_RETURN_IF_ERROR(
        jobspec::CheckIntInRange("page_size", request.page_size(), 1, kMaxListPageSize));
  }
  if (!request.page_token().empty()) {
    ZS_RETURN_IF_ERROR(ParseJobPageToken(request.page_token()).status());
  }
  return absl::OkStatus();
}

absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request) {
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  return jobspec::CheckMaxBytes("reason", request.reason(), kMaxCancelReasonBytes);
}

absl::Status ValidateWatchJobRequest(const v1::WatchJobRequest& request) {
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  return CheckNonNegative("after_sequence", request.after_sequence());
}

absl::Status ValidateGetShardPlanRequest(const v1::GetShardPlanRequest& request) {
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("generation", request.generation()));
  return CheckRank(request.rank());
}

absl::Status ValidateStoreSetRequest(const v1::StoreSetRequest& request) {
  ZS_RETURN_IF_ERROR(CheckStoreScope(request.job_id(), request.generation()));
  ZS_RETURN_IF_ERROR(CheckStoreKey(request.key()));
  return jobspec::CheckMaxBytes("value", request.value(), kMaxStoreValueBytes);
}

absl::Status ValidateStoreGetRequest(const v1::StoreGetRequest& request) {
  ZS_RETURN_IF_ERROR(CheckStoreScope(request.job_id(), request.generation()));
  ZS_RETURN_IF_ERROR(CheckStoreKey(request.key()));
  return jobspec::CheckIntInRange("timeout_ms", request.timeout_ms(), 0, kMaxStoreTimeoutMs);
}

absl::Status ValidateStoreAddRequest(const v1::StoreAddRequest& request) {
  ZS_RETURN_IF_ERROR(CheckStoreScope(request.job_id(), request.generation()));
  return CheckStoreKey(request.key());
}

absl::Status ValidateStoreDeleteRequest(const v1::StoreDeleteRequest& request) {
  ZS_RETURN_IF_ERROR(CheckStoreScope(request.job_id(), request.generation()));
  return CheckStoreKey(request.key());
}

absl::Status ValidateReportProgressRequest(const v1::ReportProgressRequest& request) {
  ZS_RETURN_IF_ERROR(CheckWorkerId("worker_id", request.worker_id()));
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  ZS_RETURN_IF_ERROR(CheckAtLeast("generation", request.generation(), 1));
  ZS_RETURN_IF_ERROR(CheckRank(request.rank()));
  if (!request.has_metrics()) return Required("metrics");
  ZS_RETURN_IF_ERROR(CheckMetrics(request.metrics()));
  return jobspec::CheckMaxBytes("notice", request.notice(), kMaxNoticeBytes);
}

absl::Status ValidateCommitCheckpointRequest(const v1::CommitCheckpointRequest& request) {
  ZS_RETURN_IF_ERROR(CheckWorkerId("worker_id", request.worker_id()));
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  ZS_RETURN_IF_ERROR(CheckAtLeast("generation", request.generation(), 1));
  ZS_RETURN_IF_ERROR(CheckRank(request.rank()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("step", request.step()));
  if (!v1::CheckpointOutcome_IsValid(request.outcome())) {
    return absl::InvalidArgumentError(
        absl::StrCat("outcome: unknown value ", static_cast<int>(request.outcome())));
  }
  ZS_RETURN_IF_ERROR(
      jobspec::CheckMaxBytes("message", request.message(), kMaxCheckpointMessageBytes));
  // Capped whatever the outcome: an ignored path is still a string the request carries.
  ZS_RETURN_IF_ERROR(
      jobspec::CheckMaxBytes("path", request.path(), jobspec::kMaxCheckpointPathBytes));
  if (request.outcome() != v1::CHECKPOINT_WRITTEN) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(jobspec::ValidateCheckpointPath(request.path(), "path"));
  return CheckNonNegative("bytes", request.bytes());
}

absl::Status ValidateRewindJobRequest(const v1::RewindJobRequest& request) {
  ZS_RETURN_IF_ERROR(CheckWorkerId("worker_id", request.worker_id()));
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  ZS_RETURN_IF_ERROR(CheckAtLeast("generation", request.generation(), 1));
  ZS_RETURN_IF_ERROR(CheckRank(request.rank()));
  ZS_RETURN_IF_ERROR(CheckNonNegative("step", request.step()));
  if (request.step() >= kMaxRewindStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", request.step(), " must be < ", kMaxRewindStep));
  }
  ZS_RETURN_IF_ERROR(
      jobspec::CheckMaxBytes("loaded_job_id", request.loaded_job_id(), kMaxLoadedJobIdBytes));
  if (request.has_loaded_checkpoint()) {
    if (request.loaded_job_id().empty()) return Required("loaded_job_id");
    ZS_RETURN_IF_ERROR(
        CheckNonNegative("loaded_checkpoint.step", request.loaded_checkpoint().step()));
    ZS_RETURN_IF_ERROR(
        CheckNonNegative("loaded_checkpoint.generation", request.loaded_checkpoint().generation()));
  }
  return jobspec::CheckMaxBytes("reason", request.reason(), kMaxCheckpointMessageBytes);
}

absl::Status ValidateExportCheckpointRequest(const v1::ExportCheckpointRequest& request) {
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  if (request.has_step()) ZS_RETURN_IF_ERROR(CheckNonNegative("step", request.step()));
  return absl::OkStatus();
}

absl::Status ValidateVerifyCheckpointRequest(const v1::VerifyCheckpointRequest& request) {
  ZS_RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  if (request.has_step()) ZS_RETURN_IF_ERROR(CheckNonNegative("step", request.step()));
  return absl::OkStatus();
}

}  // namespace zeroshard::coordinator
