// The read-only queries that the gRPC service and the dashboard's JSON API both answer: request
// validation, paging and the JobManager call in one place, so both say the same for a request.
#ifndef ZEROSHARD_COORDINATOR_QUERIES_H_
#define ZEROSHARD_COORDINATOR_QUERIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_manager.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// Events one ListJobEvents call returns at most, and without a limit.
inline constexpr int64_t kMaxJobEventsPage = 10000;
inline constexpr int64_t kDefaultJobEventsPage = 1000;

// Each validates `request` (INVALID_ARGUMENT naming the field), then asks `manager`; the errors
// are the manager's (NOT_FOUND naming the job...). Thread-safe as the manager is.
absl::StatusOr<v1::ListWorkersResponse> ListWorkers(JobManager& manager,
                                                    const v1::ListWorkersRequest& request);
absl::StatusOr<v1::ListJobsResponse> ListJobs(JobManager& manager,
                                              const v1::ListJobsRequest& request);
// By id, or the `caller`'s job with request.run_key (the caller's name, as SubmitJob records
// its submitter).
absl::StatusOr<v1::Job> GetJob(JobManager& manager, const v1::GetJobRequest& request,
                               const std::string& caller);
absl::StatusOr<v1::ShardPlan> GetShardPlan(JobManager& manager,
                                           const v1::GetShardPlanRequest& request);

// The job's durable events with a sequence above `after_sequence`, in order, at most `limit`
// (in [1, kMaxJobEventsPage]): one page of the history WatchJob sends, read the same way
// (JobManager::WatchPage). INVALID_ARGUMENT naming job_id, after_sequence or limit.
absl::StatusOr<std::vector<v1::JobEvent>> ListJobEvents(JobManager& manager,
                                                        const std::string& job_id,
                                                        int64_t after_sequence, int64_t limit);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_QUERIES_H_
