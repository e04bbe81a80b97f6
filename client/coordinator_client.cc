// Coordinator client: thin, deadline-bounded wrappers over the generated stub.
#include "client/coordinator_client.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"

namespace zeroshard::client {
namespace {

// The coordinator's largest page_size: fewest round trips. Replies stay under gRPC's 4 MiB
// limit because the coordinator also ends a page at 2 MiB.
constexpr int kListPageSize = 1000;

}  // namespace

CoordinatorClient::CoordinatorClient(const std::string& target, absl::Duration rpc_timeout)
    : CoordinatorClient(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()),
                        rpc_timeout) {}

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                     absl::Duration rpc_timeout)
    : stub_(v1::Coordinator::NewStub(std::move(channel))), rpc_timeout_(rpc_timeout) {}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    const std::string& target, const security::ClientCredentials& credentials,
    absl::Duration rpc_timeout) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      security::CreateCoordinatorChannel(target, credentials);
  if (!channel.ok()) return channel.status();
  return std::make_unique<CoordinatorClient>(*std::move(channel), rpc_timeout);
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  return context;
}

absl::StatusOr<v1::Job> CoordinatorClient::SubmitJob(const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  absl::Status status = common::FromGrpcStatus(stub_->SubmitJob(Context().get(), request, &job));
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::Job> CoordinatorClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  absl::Status status = common::FromGrpcStatus(stub_->GetJob(Context().get(), request, &job));
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<std::vector<v1::Job>> CoordinatorClient::ListJobs(v1::JobState state, int limit) {
  v1::ListJobsRequest request;
  request.set_state(state);
  std::vector<v1::Job> jobs;
  while (limit <= 0 || static_cast<int>(jobs.size()) < limit) {
    const int wanted = limit <= 0 ? kListPageSize : limit - static_cast<int>(jobs.size());
    request.set_page_size(std::min(wanted, kListPageSize));
    v1::ListJobsResponse response;
    absl::Status status =
        common::FromGrpcStatus(stub_->ListJobs(Context().get(), request, &response));
    if (!status.ok()) return status;
    for (v1::Job& job : *response.mutable_jobs()) jobs.push_back(std::move(job));
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  return jobs;
}

absl::StatusOr<v1::Job> CoordinatorClient::CancelJob(const std::string& job_id,
                                                     const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::Job job;
  absl::Status status = common::FromGrpcStatus(stub_->CancelJob(Context().get(), request, &job));
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<std::vector<v1::WorkerInfo>> CoordinatorClient::ListWorkers(v1::WorkerState state) {
  v1::ListWorkersRequest request;
  request.set_state(state);
  request.set_page_size(kListPageSize);
  std::vector<v1::WorkerInfo> workers;
  while (true) {
    v1::ListWorkersResponse response;
    absl::Status status =
        common::FromGrpcStatus(stub_->ListWorkers(Context().get(), request, &response));
    if (!status.ok()) return status;
    for (v1::WorkerInfo& worker : *response.mutable_workers()) workers.push_back(std::move(worker));
    if (response.next_page_token().empty()) return workers;
    request.set_page_token(response.next_page_token());
  }
}

absl::StatusOr<v1::ShardPlan> CoordinatorClient::GetShardPlan(const std::string& job_id,
                                                              int64_t generation, int rank,
                                                              bool include_layout) {
  v1::GetShardPlanRequest request;
  request.set_job_id(job_id);
  request.set_generation(generation);
  request.set_rank(rank);
  request.set_include_layout(include_layout);
  v1::ShardPlan plan;
  absl::Status status =
      common::FromGrpcStatus(stub_->GetShardPlan(Context().get(), request, &plan));
  if (!status.ok()) return status;
  return plan;
}

absl::Status CoordinatorClient::WatchJob(const std::string& job_id, int64_t after_sequence,
                                         const std::function<void(const v1::JobEvent&)>& on_event) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_after_sequence(after_sequence);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  v1::JobEvent event;
  while (reader->Read(&event)) on_event(event);
  return common::FromGrpcStatus(reader->Finish());
}

absl::StatusOr<v1::VerifyCheckpointResponse> CoordinatorClient::VerifyCheckpoint(
    const std::string& job_id, std::optional<int64_t> step, absl::Duration timeout) {
  v1::VerifyCheckpointRequest request;
  request.set_job_id(job_id);
  if (step.has_value()) request.set_step(*step);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::VerifyCheckpointResponse response;
  absl::Status status =
      common::FromGrpcStatus(stub_->VerifyCheckpoint(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::Status CoordinatorClient::ExportCheckpoint(
    const std::string& job_id, std::optional<int64_t> step,
    const std::function<absl::Status(const v1::ExportCheckpointChunk&)>& on_chunk) {
  v1::ExportCheckpointRequest request;
  request.set_job_id(job_id);
  if (step.has_value()) request.set_step(*step);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::ExportCheckpointChunk>> reader =
      stub_->ExportCheckpoint(&context, request);
  v1::ExportCheckpointChunk chunk;
  absl::Status taken;
  while (taken.ok() && reader->Read(&chunk)) taken = on_chunk(chunk);
  if (!taken.ok()) {
    // The coordinator stops reading; Finish then returns at once (CANCELLED), which `taken`
    // explains better.
    context.TryCancel();
    reader->Finish();
    return taken;
  }
  return common::FromGrpcStatus(reader->Finish());
}

}  // namespace zeroshard::client
