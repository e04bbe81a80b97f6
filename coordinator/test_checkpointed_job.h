// Test support: a job driven through a coordinator's RPCs as its workers would, its checkpoint
// files written and committed, and the bytes an export of one of them must stream.
#ifndef ZEROSHARD_COORDINATOR_TEST_CHECKPOINTED_JOB_H_
#define ZEROSHARD_COORDINATOR_TEST_CHECKPOINTED_JOB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/export.h"
#include "checkpoint/manifest.h"
#include "checkpoint/test_checkpoints.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator::testing {

struct CheckpointedJobOptions {
  std::string name = "exported";
  // The MLP: nn.Sequential(Linear(1024, 1024), ReLU(), Linear(1024, 16)) exports 4.26 MB.
  std::vector<int64_t> layer_sizes = {1024, 1024, 16};
  int workers = 2;
  int64_t steps = 4;
  // Steps whose checkpoint every rank writes and commits.
  std::vector<int64_t> checkpoint_steps = {2, 4};
  std::vector<checkpoint::testing::TestState> states = {{"param", v1::BFLOAT16},
                                                        {"master", v1::FLOAT32}};
  // Every rank reports finished after the checkpoints, so the job SUCCEEDS.
  bool finish = true;
};

// A value per (state, tensor, element); masters and params differ, so an export of the wrong
// state shows.
inline float CheckpointedJobValue(absl::string_view state, absl::string_view tensor,
                                  int64_t index) {
  const float base = state == checkpoint::kMasterState ? 0.001f : -0.002f;
  return base * static_cast<float>(index % 997 + 1) + static_cast<float>(tensor.size());
}

// Calls one unary method of `stub` with a 30 s deadline.
template <typename Request, typename Response>
absl::Status CallCoordinator(v1::Coordinator::Stub& stub,
                             grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                           const Request&,
                                                                           Response*),
                             const Request& request, Response* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return common::FromGrpcStatus((stub.*method)(&context, request, response));
}

// Registers `options.workers` workers, submits the job (it must start at once: no other idle
// workers), writes and commits each checkpoint step as every rank would, then (with `finish`)
// finishes every rank. Returns the job as the coordinator then has it.
inline absl::StatusOr<v1::Job> RunCheckpointedJob(v1::Coordinator::Stub& stub,
                                                  const std::string& checkpoint_root,
                                                  const CheckpointedJobOptions& options) {
  using Stub = v1::Coordinator::Stub;
  for (int w = 0; w < options.workers; ++w) {
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat(options.name, "-worker-", w));
    request.set_host("host-a");
    request.set_device_kind(v1::CPU);
    v1::RegisterWorkerResponse response;
    absl::Status registered = CallCoordinator(stub, &Stub::RegisterWorker, request, &response);
    if (!registered.ok()) return registered;
  }
  v1::SubmitJobRequest submit;
  v1::JobSpec& spec = *submit.mutable_spec();
  spec.set_name(options.name);
  for (int64_t size : options.layer_sizes) spec.mutable_workload()->add_layer_sizes(size);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_min_workers(options.workers);
  spec.set_max_workers(options.workers);
  spec.set_global_batch(128);
  spec.set_steps(options.steps);
  v1::Job job;
  absl::Status submitted = CallCoordinator(stub, &Stub::SubmitJob, submit, &job);
  if (!submitted.ok()) return submitted;
  if (job.state() != v1::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.id(), " is ", v1::JobState_Name(job.state()), ", not RUNNING"));
  }
  v1::HeartbeatRequest beat;
  beat.set_worker_id(job.worker_ids(0));
  v1::HeartbeatResponse assignment;
  absl::Status beaten = CallCoordinator(stub, &Stub::Heartbeat, beat, &assignment);
  if (!beaten.ok()) return beaten;

  const std::string job_dir =
      checkpoint::JobCheckpointDir(checkpoint_root, job.spec().checkpoint().dir());
  for (int64_t step : options.checkpoint_steps) {
    checkpoint::testing::TestCheckpointSpec files;
    files.job_id = job.id();
    files.step = step;
    files.generation = job.generation();
    files.world_size = job.worker_ids_size();
    files.tensors = checkpoint::testing::SequentialTensors(options.layer_sizes);
    files.states = options.states;
    files.bucket_elems = 1 << 20;
    files.layout_hash = assignment.assignment().plan_layout_hash();
    absl::StatusOr<std::vector<checkpoint::WrittenFile>> written =
        checkpoint::testing::WriteTestShardFiles(checkpoint::StepDir(job_dir, step), files,
                                                 CheckpointedJobValue);
    if (!written.ok()) return written.status();
    for (int32_t rank = 0; rank < files.world_size; ++rank) {
      v1::CommitCheckpointRequest commit;
      commit.set_worker_id(job.worker_ids(rank));
      commit.set_job_id(job.id());
      commit.set_generation(job.generation());
      commit.set_rank(rank);
      commit.set_step(step);
      commit.set_path(absl::StrCat(job.spec().checkpoint().dir(), "/",
                                   checkpoint::StepDirName(step), "/",
                                   checkpoint::ShardFileName(rank, files.world_size)));
      commit.set_bytes(static_cast<int64_t>((*written)[rank].bytes));
      commit.set_crc32c((*written)[rank].crc32c);
      v1::CommitCheckpointResponse response;
      absl::Status committed = CallCoordinator(stub, &Stub::CommitCheckpoint, commit, &response);
      if (!committed.ok()) return committed;
    }
  }
  if (options.finish) {
    for (int32_t rank = 0; rank < job.worker_ids_size(); ++rank) {
      v1::ReportProgressRequest report;
      report.set_worker_id(job.worker_ids(rank));
      report.set_job_id(job.id());
      report.set_generation(job.generation());
      report.set_rank(rank);
      report.mutable_metrics()->set_step(options.steps);
      report.mutable_metrics()->set_loss(0.5);
      report.mutable_metrics()->set_loss_scale(1.0);
      report.set_finished(true);
      v1::ReportProgressResponse response;
      absl::Status reported = CallCoordinator(stub, &Stub::ReportProgress, report, &response);
      if (!reported.ok()) return reported;
    }
  }
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  absl::Status got = CallCoordinator(stub, &Stub::GetJob, get, &job);
  if (!got.ok()) return got;
  return job;
}

// The file an export of `job`'s checkpoint at `step` must stream, from the checkpoint library.
inline absl::StatusOr<std::string> ExpectedExport(const std::string& checkpoint_root,
                                                  const v1::Job& job, int64_t step, bool is_final) {
  absl::StatusOr<checkpoint::Directory> root = checkpoint::Directory::OpenRoot(checkpoint_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<checkpoint::CommittedCheckpoint> committed =
      checkpoint::OpenCommittedCheckpoint(*root, job.spec().checkpoint().dir(), step, job.id());
  if (!committed.ok()) return committed.status();
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
      checkpoint::CheckpointReader::Open(*std::move(committed));
  if (!reader.ok()) return reader.status();
  absl::StatusOr<checkpoint::CheckpointExport> file =
      checkpoint::CheckpointExport::Create(reader->get(), is_final);
  if (!file.ok()) return file.status();
  std::string bytes;
  absl::Status streamed = file->Stream([&](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return absl::OkStatus();
  });
  if (!streamed.ok()) return streamed;
  return bytes;
}

}  // namespace zeroshard::coordinator::testing

#endif  // ZEROSHARD_COORDINATOR_TEST_CHECKPOINTED_JOB_H_
