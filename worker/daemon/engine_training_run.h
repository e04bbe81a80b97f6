// The real TrainingRun: one generation of a job on this worker. Rendezvous through the
// coordinator's store, a communicator (Gloo on the CPU, NCCL on a CUDA device), the workload,
// the ZeRO engine, and the step loop that reports progress to the coordinator.
#ifndef ZEROSHARD_WORKER_DAEMON_ENGINE_TRAINING_RUN_H_
#define ZEROSHARD_WORKER_DAEMON_ENGINE_TRAINING_RUN_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "sharding/shard_planner.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/daemon/thread_placement.h"
#include "worker/daemon/training_run.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::worker {

struct EngineTrainingRunOptions {
  std::shared_ptr<v1::Coordinator::StubInterface> stub;
  std::string worker_id;
  // The address peers reach this worker's Gloo endpoint at.
  std::string listen_host = "127.0.0.1";
  // Threads of the optimizer kernels (CPU).
  int threads = 1;
  // >= 0: train on this CUDA device (NCCL, the CUDA kernels and workload; needs a build with
  // --config=cuda, see cuda_support.h). -1: on the CPU (Gloo).
  int cuda_device = -1;
  // When set, rank 0 writes the final parameters of a finished job to
  // <dir>/<job_id>.f32 (raw little-endian fp32, the catalog's tensor order).
  std::string final_params_dir;
  // engine::EngineConfig::bucket_pool_size (the reduce buffers zero2 keeps in flight).
  int bucket_pool_size = engine::EngineConfig().bucket_pool_size;
  // The CPU communicator's tuning: its segment_bytes, staging_segments, lanes and thread_nice are
  // used; rank, world size, store, hostname (listen_host) and thread_cpus (from `pinning`) are the
  // run's.
  comm::GlooCommunicatorOptions gloo;
  // Where the training and communication threads run on a CPU run.
  ThreadPinning pinning = ThreadPinning::kNone;
  absl::Duration rpc_timeout = absl::Seconds(10);
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

 private:
  EngineTrainingRun(const v1::Assignment& assignment, EngineTrainingRunOptions options);
  void Main();
  absl::Status Train();
  // Reports to the coordinator; returns false when the generation is no longer current.
  absl::StatusOr<bool> Report(const v1::StepMetrics& metrics, bool finished);
  // Rank 0's final parameters, for comparing runs (see final_params_dir). `host_memory`: the
  // engine's buffers are host memory (a CPU run).
  absl::Status WriteFinalParameters(engine::Engine& engine, const sharding::ShardPlan& plan,
                                    bool host_memory);

  const v1::Assignment assignment_;
  const EngineTrainingRunOptions options_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> done_{false};
  std::atomic<int64_t> step_{0};

  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Set while the communicator exists, so Abort() can unblock its collectives.
  comm::Communicator* communicator_ ABSL_GUARDED_BY(mu_) = nullptr;

  std::thread thread_;
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_ENGINE_TRAINING_RUN_H_
