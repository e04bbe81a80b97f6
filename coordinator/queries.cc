// The shared read-only queries: validation, paging and the manager's answer.
#include "coordinator/queries.h"

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "coordinator/page_token.h"
#include "coordinator/request_validation.h"
#include "jobspec/job_plan.h"
#include "sharding/shard_planner.h"

namespace zeroshard::coordinator {
namespace {

// A listing page of `page_size` items (the documented default when unset) that fits in a reply.
PageRequest PageRequestOf(bool has_page_size, int32_t page_size) {
  PageRequest page;
  page.max_items = has_page_size ? page_size : kDefaultListPageSize;
  page.max_bytes = kMaxListReplyBytes;
  return page;
}

// Keeps one page of a job's history. The manager may also offer it later events once the page
// reached the newest one (it follows the job then); those are refused after Close().
// Thread-safe: the manager calls OnEvent under its lock, the reader reads after WatchPage.
class PageSink final : public JobEventSink {
 public:
  bool OnEvent(const v1::JobEvent& event) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    events_.push_back(event);
    return true;
  }
  void OnJobEnded() override {}

  // Ends the page: returns its events; later ones are refused (and the manager drops the sink).
  std::vector<v1::JobEvent> Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    return std::move(events_);
  }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(JobManager& manager,
                                                    const v1::ListWorkersRequest& request) {
  ZS_RETURN_IF_ERROR(ValidateListWorkersRequest(request));
  PageRequest page = PageRequestOf(request.has_page_size(), request.page_size());
  if (!request.page_token().empty()) {
    ZS_ASSIGN_OR_RETURN(page.after, ParseWorkerPageToken(request.page_token()));
  }
  Page<v1::WorkerInfo> workers = manager.ListWorkersPage(request.state(), page);
  v1::ListWorkersResponse response;
  for (v1::WorkerInfo& worker : workers.items) *response.add_workers() = std::move(worker);
  if (workers.next_after.has_value()) {
    response.set_next_page_token(MakePageToken(FormatWorkerId(*workers.next_after)));
  }
  return response;
}

absl::StatusOr<v1::ListJobsResponse> ListJobs(JobManager& manager,
                                              const v1::ListJobsRequest& request) {
  ZS_RETURN_IF_ERROR(ValidateListJobsRequest(request));
  // `limit` is page_size's older name; validation refused setting both.
  PageRequest page = request.has_limit()
                         ? PageRequestOf(true, request.limit())
                         : PageRequestOf(request.has_page_size(), request.page_size());
  if (!request.page_token().empty()) {
    ZS_ASSIGN_OR_RETURN(page.after, ParseJobPageToken(request.page_token()));
  }
  Page<v1::Job> jobs = manager.ListJobs(request.state(), page);
  v1::ListJobsResponse response;
  for (v1::Job& job : jobs.items) *response.add_jobs() = std::move(job);
  if (jobs.next_after.has_value()) {
    response.set_next_page_token(MakePageToken(FormatJobId(*jobs.next_after)));
  }
  return response;
}

absl::StatusOr<v1::Job> GetJob(JobManager& manager, const v1::GetJobRequest& request,
                               const std::string& caller) {
  ZS_RETURN_IF_ERROR(ValidateGetJobRequest(request));
  if (!request.run_key().empty()) return manager.FindJobByRunKey(caller, request.run_key());
  return manager.GetJob(request.job_id());
}

absl::StatusOr<v1::ShardPlan> GetShardPlan(JobManager& manager,
                                           const v1::GetShardPlanRequest& request) {
  ZS_RETURN_IF_ERROR(ValidateGetShardPlanRequest(request));
  ZS_ASSIGN_OR_RETURN(v1::ShardPlan plan, manager.GetShardPlan(request));
  // The spec never changes: the formula is the plan's job's at the plan's W.
  ZS_ASSIGN_OR_RETURN(const v1::Job job, manager.GetJob(request.job_id()));
  int64_t gather_pool_bytes = 0;
  if (job.spec().mode() == v1::ZERO3) {
    // The pool depends on module spans, which this rank's view does not carry: replan (cheap
    // next to the model, and the same plan: the spec and W are the generation's).
    ZS_ASSIGN_OR_RETURN(const sharding::ShardPlan full,
                        jobspec::PlanForJob(job.spec(), plan.world_size()));
    gather_pool_bytes = jobspec::GatherPoolBytesForJob(job.spec(), full);
  }
  *plan.mutable_model_state_formula() = jobspec::ModelStateFormulaForJob(
      job.spec(), plan.world_size(), plan.model_elems(), gather_pool_bytes);
  return plan;
}

absl::StatusOr<std::vector<v1::JobEvent>> ListJobEvents(JobManager& manager,
                                                        const std::string& job_id,
                                                        int64_t after_sequence, int64_t limit) {
  v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  watch.set_after_sequence(after_sequence);
  ZS_RETURN_IF_ERROR(ValidateWatchJobRequest(watch));
  if (limit < 1 || limit > kMaxJobEventsPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", limit, " is out of range [1, ", kMaxJobEventsPage, "]"));
  }
  auto sink = std::make_shared<PageSink>();
  const absl::StatusOr<JobManager::WatchPosition> position =
      manager.WatchPage(job_id, after_sequence, limit, sink);
  std::vector<v1::JobEvent> events = sink->Close();
  if (position.ok() && position->following) manager.Unwatch(job_id, sink.get());
  if (!position.ok()) return position.status();
  return events;
}

}  // namespace zeroshard::coordinator
