// Shape validation of every Coordinator RPC request, run before the request touches state.
// Each function returns OK or INVALID_ARGUMENT whose message starts with the field's path
// ("worker_id: ...", "metrics.step_ms: NaN is not allowed ..."); checks run in field order and
// the first error wins. Checks against state (unknown ids, stale generations, rank < world
// size) are the service's.
#ifndef ZEROSHARD_COORDINATOR_REQUEST_VALIDATION_H_
#define ZEROSHARD_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// Bounds that coordinator.proto's comments document.
inline constexpr size_t kMaxHostLength = 253;
inline constexpr int64_t kMaxDeviceMemoryBytes = int64_t{1} << 50;
// RegisterWorkerRequest.memory_limit_bytes (a worker's --memory_limit_bytes) is at most this.
inline constexpr int64_t kMaxMemoryLimitBytes = int64_t{1} << 50;
inline constexpr int kMaxWorkerLabels = 32;
inline constexpr size_t kMaxLabelKeyLength = 63;
inline constexpr size_t kMaxLabelValueBytes = 256;
// sockaddr_un's sun_path holds 108 bytes with the terminating NUL.
inline constexpr size_t kMaxAttachSocketBytes = 107;
inline constexpr size_t kMaxCancelReasonBytes = 1024;
inline constexpr size_t kMaxRunErrorBytes = 1024;
inline constexpr int32_t kMaxListJobsLimit = 1000;
// ListWorkers and ListJobs pages: page_size's default and maximum, and the most bytes of items
// one reply holds (half of gRPC's default 4 MiB receive limit; a reply holds at least one item).
inline constexpr int32_t kDefaultListPageSize = 100;
inline constexpr int32_t kMaxListPageSize = 1000;
inline constexpr size_t kMaxListReplyBytes = size_t{2} << 20;
inline constexpr size_t kMaxStoreKeyBytes = 512;
inline constexpr size_t kMaxStoreValueBytes = size_t{1} << 20;
inline constexpr int64_t kMaxStoreTimeoutMs = 600000;

// Workers.
// `previous_worker_id` may be empty, but not when `status.job_id` is set; `status` as on
// heartbeats; `attach_socket` empty, or an absolute path of at most kMaxAttachSocketBytes bytes
// without control characters.
absl::Status ValidateRegisterWorkerRequest(const v1::RegisterWorkerRequest& request);
// `status.job_id` may be empty (an idle worker); when set it must be a job id. `status.rank` is in
// [0, kMaxWorldSize).
absl::Status ValidateHeartbeatRequest(const v1::HeartbeatRequest& request);
absl::Status ValidateLeaveWorkerRequest(const v1::LeaveWorkerRequest& request);
// WORKER_STATE_UNSPECIFIED (list all) is allowed; `page_size`, when set, is in [1, 1000];
// `page_token` is empty or one a ListWorkers reply made.
absl::Status ValidateListWorkersRequest(const v1::ListWorkersRequest& request);

// Jobs.
// Takes the request as the client sent it: applies WithDefaults (without a job id, so an unset
// checkpoint.dir stays empty and is accepted) and runs ValidateJobSpec on the result. Messages
// name the field from the request: "spec.optimizer.lr: ...". The job manager applies the
// defaults again with the minted id before it stores the spec.
absl::Status ValidateSubmitJobRequest(const v1::SubmitJobRequest& request);
absl::Status ValidateGetJobRequest(const v1::GetJobRequest& request);
// JOB_STATE_UNSPECIFIED (list all) is allowed; `page_size` or its older name `limit` (not both),
// when set, is in [1, 1000]; `page_token` is empty or one a ListJobs reply made.
absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request);
absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request);
absl::Status ValidateWatchJobRequest(const v1::WatchJobRequest& request);
// `generation` 0 means the current one; `rank` is in [0, kMaxWorldSize).
absl::Status ValidateGetShardPlanRequest(const v1::GetShardPlanRequest& request);

// Rendezvous store: generation >= 1, key 1 to 512 bytes.
absl::Status ValidateStoreSetRequest(const v1::StoreSetRequest& request);
absl::Status ValidateStoreGetRequest(const v1::StoreGetRequest& request);
absl::Status ValidateStoreAddRequest(const v1::StoreAddRequest& request);
absl::Status ValidateStoreDeleteRequest(const v1::StoreDeleteRequest& request);

// Progress and checkpoints, from workers.
// `metrics` is required. Times are finite and >= 0, memory byte counts >= 0, loss finite,
// grad_norm finite and >= 0, loss_scale finite and > 0; the per-bucket figures have at most
// jobspec::kMaxReportedBuckets entries each, both the same number, and no bucket's wait in
// backward is more than its whole wait. A skipped step (`metrics.skipped`) was
// skipped because a gradient was not finite, so its loss and grad_norm may be NaN or Inf.
absl::Status ValidateReportProgressRequest(const v1::ReportProgressRequest& request);
// `path` is checked with ValidateCheckpointPath.
absl::Status ValidateCommitCheckpointRequest(const v1::CommitCheckpointRequest& request);
absl::Status ValidateRewindJobRequest(const v1::RewindJobRequest& request);

// Checkpoints, for people. `step`, when set, is >= 0.
absl::Status ValidateExportCheckpointRequest(const v1::ExportCheckpointRequest& request);
// `job_id` is required; `step`, when set, is >= 0.
absl::Status ValidateVerifyCheckpointRequest(const v1::VerifyCheckpointRequest& request);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_REQUEST_VALIDATION_H_
