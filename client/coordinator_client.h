// A C++ client of the Coordinator service for people-facing tools (the CLI, tests, benchmarks):
// one method per RPC, each with a deadline, returning absl::Status.
#ifndef ZEROSHARD_CLIENT_COORDINATOR_CLIENT_H_
#define ZEROSHARD_CLIENT_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "security/coordinator_channel.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::client {

// Thread-safe (gRPC stubs are).
class CoordinatorClient {
 public:
  // `target` is host:port of the coordinator, reached in plaintext without credentials (loopback
  // development and tests).
  explicit CoordinatorClient(const std::string& target,
                             absl::Duration rpc_timeout = absl::Seconds(10));
  // A channel that carries credentials (security::CreateCoordinatorChannel).
  explicit CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                             absl::Duration rpc_timeout = absl::Seconds(10));

  // A client of `target` with `credentials` (TLS, token); errors name the bad option.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Create(
      const std::string& target, const security::ClientCredentials& credentials,
      absl::Duration rpc_timeout = absl::Seconds(10));

  absl::StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // The newest `limit` jobs (all when `limit` <= 0), fetched page by page.
  absl::StatusOr<std::vector<v1::Job>> ListJobs(v1::JobState state, int limit);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  // Every worker (in `state` unless unspecified), fetched page by page.
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers(v1::WorkerState state);
  // `generation` 0 asks for the current one; the reply names the generation it describes.
  absl::StatusOr<v1::ShardPlan> GetShardPlan(const std::string& job_id, int64_t generation,
                                             int rank, bool include_layout);

  // Streams the job's events after `after_sequence` to `on_event` until the job ends (OK) or
  // the stream fails. No deadline: it lasts as long as the job.
  absl::Status WatchJob(const std::string& job_id, int64_t after_sequence,
                        const std::function<void(const v1::JobEvent&)>& on_event);

  // Streams the export of the job's checkpoint at `step` (without one, its final checkpoint) to
  // `on_chunk`, in order, until the stream ends. An error from `on_chunk` cancels the stream and
  // is returned. No deadline: it lasts as long as the file takes.
  absl::Status ExportCheckpoint(
      const std::string& job_id, std::optional<int64_t> step,
      const std::function<absl::Status(const v1::ExportCheckpointChunk&)>& on_chunk);

  // Admin only: the coordinator reads every file of the job's checkpoint at `step` (without
  // one, its latest committed checkpoint) and reports each one's state against the manifest.
  // A damaged checkpoint is an OK reply with `ok` false. The call lasts as long as reading the
  // checkpoint takes, so its deadline is `timeout`, not the client's RPC timeout.
  absl::StatusOr<v1::VerifyCheckpointResponse> VerifyCheckpoint(
      const std::string& job_id, std::optional<int64_t> step,
      absl::Duration timeout = absl::Hours(1));

  v1::Coordinator::Stub* stub() { return stub_.get(); }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const;

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Duration rpc_timeout_;
};

}  // namespace zeroshard::client

#endif  // ZEROSHARD_CLIENT_COORDINATOR_CLIENT_H_
