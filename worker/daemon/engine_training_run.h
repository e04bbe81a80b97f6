// The real TrainingRun: one generation of a job on this worker. Rendezvous through the
// coordinator's store, a communicator (Gloo on the CPU, NCCL on a CUDA device), the workload,
// the ZeRO engine, and the step loop that reports progress to the coordinator.
#ifndef ZEROSHARD_WORKER_DAEMON_ENGINE_TRAINING_RUN_H_
#define ZEROSHARD_WORKER_DAEMON_ENGINE_TRAINING_RUN_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "sharding/shard_planner.h"
#include "worker/attach/attach_listener.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/daemon/thread_placement.h"
#include "worker/daemon/training_run.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"
#include "zeroshard/v1/attach.pb.h"
#include "zeroshard/v1/checkpoint.pb.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::worker {

struct EngineTrainingRunOptions {
  std::shared_ptr<v1::Coordinator::StubInterface> stub;
  std::string worker_id;
  // The worker's name (--name): an attached trainer is told it in the welcome.
  std::string worker_name;
  // The address peers reach this worker's Gloo endpoint at.
  std::string listen_host = "127.0.0.1";
  // Threads of the optimizer kernels (CPU).
  int threads = 1;
  // >= 0: train on this CUDA device (NCCL, the CUDA kernels and workload; needs a build with
  // --config=cuda, see cuda_support.h). -1: on the CPU (Gloo).
  int cuda_device = -1;
  // The checkpoint root (the coordinator's --checkpoint_root, the same directory): where this
  // rank writes its checkpoints and reads the one its generation resumes from. Empty: no
  // checkpoints are written, and a generation that must resume fails.
  std::string checkpoint_root;
  // engine::EngineConfig::bucket_pool_size (the reduce buffers zero2 keeps in flight).
  int bucket_pool_size = engine::EngineConfig().bucket_pool_size;
  // engine::EngineConfig::memory_limit_bytes (the worker's --memory_limit_bytes; 0: none).
  int64_t memory_limit_bytes = 0;
  // The CPU communicator's tuning: its segment_bytes, staging_segments, lanes, thread_nice,
  // transport, host and shm sizes are used; rank, world size, store, hostname (listen_host) and
  // thread_cpus (from `pinning`) are the run's.
  comm::GlooCommunicatorOptions gloo;
  // Where the training and communication threads run on a CPU run.
  ThreadPinning pinning = ThreadPinning::kNone;
  absl::Duration rpc_timeout = absl::Seconds(10);
  // The worker's listening attach socket (docs/pytorch.md), not owned; -1: none, and attached
  // jobs fail. An attached run accepts its trainer here.
  int attach_listen_fd = -1;
  // Who may attach there (AttachListener::peers()).
  attach::AttachPeerPolicy attach_peers;
  // How long an attached run waits for its trainer to connect and say hello.
  absl::Duration attach_timeout = absl::Minutes(2);
};

// Thread contract: see TrainingRun. The run's own thread does all the training.
class EngineTrainingRun final : public TrainingRun {
 public:
  static std::unique_ptr<EngineTrainingRun> Start(const v1::Assignment& assignment,
                                                  EngineTrainingRunOptions options);
  ~EngineTrainingRun() override;

  void Abort() override;
  bool Done() const override { return done_.load(); }
  absl::Status status() const override;
  int64_t step() const override { return step_.load(); }
  std::vector<int32_t> lost_peer_ranks() const override;

 private:
  EngineTrainingRun(const v1::Assignment& assignment, EngineTrainingRunOptions options);
  // The run's parts (communicator, engine, workload or attached trainer, checkpoint writer,
  // reporter), where the step loop stands, and what one load_state source gave: defined in the
  // .cc file.
  struct RunParts;
  struct LoopState;
  struct SourceLoad;

  void Main();
  // Assemble(), Resume(), AssembleCheckpointsAndReports(), RunSteps(), Finish().
  absl::Status Train();

  // ---- Assembly: the run's parts, built from the assignment ----
  // The plan (checked against the coordinator's), the device, the communicator, the workload
  // (an attached trainer once it has connected) and the engine.
  absl::StatusOr<std::unique_ptr<RunParts>> Assemble();
  absl::Status AssembleDeviceAndCommunicator(RunParts& parts);
  absl::Status AssembleWorkload(RunParts& parts);
  // The checkpoint writer (with a checkpoint root) and the progress reporter.
  absl::Status AssembleCheckpointsAndReports(RunParts& parts);

  // ---- Resume ----
  // Loads the checkpoint the generation resumes from, or the initial parameters (an attached
  // trainer's, sent first); welcomes an attached trainer. Returns the first step to run.
  absl::StatusOr<int64_t> Resume(RunParts& parts);

  // ---- The step loop ----
  // Runs the steps from loop.first_step: forward and backward, the engine's step, progress
  // reports, periodic checkpoints; serves an attached trainer's state_dict() and
  // load_state_dict() between steps.
  absl::Status RunSteps(RunParts& parts, LoopState& loop);
  // After the last step: flushes the reports, writes the final checkpoint, reports the finish.
  absl::Status Finish(RunParts& parts, LoopState& loop);
  // An attached trainer's state_dict(): this step's checkpoint, once its manifest is written.
  absl::StatusOr<v1::StateSaved> SaveState(RunParts& parts, LoopState& loop);
  // An attached trainer's load_state_dict(), from a named checkpoint or a full-state file.
  absl::StatusOr<v1::StateLoaded> LoadState(RunParts& parts, LoopState& loop,
                                            const v1::LoadState& request, UniqueFd source);
  SourceLoad LoadNamedCheckpoint(RunParts& parts, const v1::LoadState& request, UniqueFd source,
                                 const std::string& store_prefix);
  SourceLoad LoadFullStateFile(RunParts& parts, const v1::LoadState& request, UniqueFd source,
                               const std::string& store_prefix);
  // After a load: the job's step becomes the loaded state's. Rank 0 has the coordinator retire
  // the checkpoints after it (RewindJob) and tells the others the outcome through the store, so
  // that no rank writes a checkpoint of a later step before they are out of the way.
  absl::Status MoveToLoadedStep(RunParts& parts, LoopState& loop, int64_t loaded_step,
                                const std::optional<v1::CheckpointManifest>& loaded_checkpoint,
                                const std::string& source, const std::string& store_prefix);

  // Reports to the coordinator; returns false when the generation is no longer current.
  // `notice`, when not empty, becomes a NOTICE event of the job.
  absl::StatusOr<bool> Report(const v1::StepMetrics& metrics, bool finished,
                              const std::string& notice = "");
  // Sends one checkpoint commit (the checkpoint writer's thread), retrying through a coordinator
  // outage until a deadline or Abort().
  absl::Status Commit(const v1::CommitCheckpointRequest& request);
  absl::Status CommitOnce(const v1::CommitCheckpointRequest& request);
  // Tells the coordinator the job went back to request.step (an attached trainer's load), which
  // retires the checkpoints after it; retried through a coordinator outage like a commit.
  absl::StatusOr<v1::RewindJobResponse> Rewind(const v1::RewindJobRequest& request);
  // Waits `delay` unless Abort() comes first; true when the whole delay passed (RetryRpc's wait).
  bool WaitUnlessAborted(absl::Duration delay);

  const v1::Assignment assignment_;
  const EngineTrainingRunOptions options_;
  // Abort() aborts it. Whatever the run's thread blocks on is registered with it for as long as
  // it blocks: the rendezvous store's RPCs, the ring's connecting, the communicator's
  // collectives, the progress reports.
  comm::AbortSignal abort_signal_;
  std::atomic<bool> done_{false};
  std::atomic<int64_t> step_{0};

  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Set by the run's thread when it fails, from its communicator, before it is Done().
  std::vector<int32_t> lost_peer_ranks_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_ENGINE_TRAINING_RUN_H_
