// One generation's training on this worker.
#include "worker/daemon/engine_training_run.h"

#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "jobspec/job_plan.h"
#include "sharding/model_catalog.h"
#include "worker/attach/attached_trainer.h"
#include "worker/attach/call_agreement.h"
#include "worker/attach/shared_memory_backing.h"
#include "worker/comm/coordinator_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/daemon/checkpoint_loader.h"
#include "worker/daemon/checkpoint_schedule.h"
#include "worker/daemon/checkpoint_writer.h"
#include "worker/daemon/cuda_support.h"
#include "worker/daemon/engine_config.h"
#include "worker/daemon/progress_reporter.h"
#include "worker/daemon/rpc_retry.h"
#include "worker/daemon/step_metrics.h"
#include "worker/engine/engine.h"
#include "worker/workloads/teacher_student_mlp.h"

namespace zeroshard::worker {
namespace {

// How long the `finished` report (and the progress reports before it) and a checkpoint commit may
// wait for a coordinator that is down: a restart takes seconds.
constexpr absl::Duration kCoordinatorOutageDeadline = absl::Minutes(5);
// The longest wait between a checkpoint commit's retries through a coordinator outage.
constexpr absl::Duration kCommitMaxBackoff = absl::Milliseconds(500);
// An attached trainer's state_dict(): how long its rank waits for the others' commits (they call
// it at the same step, seconds apart at most), and how often it looks for the manifest.
constexpr absl::Duration kStateSaveTimeout = absl::Minutes(2);
constexpr absl::Duration kManifestPollInterval = absl::Milliseconds(10);
// The largest step a load may move the job to, exclusive (checkpoint directory names hold 12
// digits; RewindJob's bound).
constexpr int64_t kMaxLoadedStep = int64_t{1000000000000};
// Tests only (tests/integration/recovery_test, tools/soak.py --security): "1" makes the worker stop
// itself (SIGSTOP) after a built-in job's last step, its reports in and its final checkpoint not
// written yet, so that a test can kill it there: after the job's last step, before it SUCCEEDED.
constexpr char kStopAfterLastStepVariable[] = "ZEROSHARD_TESTONLY_STOP_AFTER_LAST_STEP";

// The commits the coordinator refused, by step: a state_dict() waiting for a manifest that will
// not come says why instead of timing out.
class CommitFailures {
 public:
  void Record(int64_t step, absl::Status status) {
    absl::MutexLock lock(&mu_);
    by_step_[step] = std::move(status);
  }
  absl::Status Find(int64_t step) const {
    absl::MutexLock lock(&mu_);
    const auto found = by_step_.find(step);
    return found == by_step_.end() ? absl::OkStatus() : found->second;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<int64_t, absl::Status> by_step_ ABSL_GUARDED_BY(mu_);
};

// Whether a failed load left the engine as it was (the source was refused before any rank
// changed its state) rather than half restored.
bool LoadWasRefused(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) || absl::IsDataLoss(status) ||
         absl::IsNotFound(status) || absl::IsInvalidArgument(status);
}

// Unless told the run succeeded, fails the communicator when destroyed (a failed communicator
// bids its peers no farewell) and hands the peers it saw die to `lost`.
class FailCommunicatorUnlessSucceeded {
 public:
  FailCommunicatorUnlessSucceeded(comm::Communicator* communicator,
                                  std::function<void(std::vector<int>)> lost)
      : communicator_(communicator), lost_(std::move(lost)) {}
  FailCommunicatorUnlessSucceeded(const FailCommunicatorUnlessSucceeded&) = delete;
  FailCommunicatorUnlessSucceeded& operator=(const FailCommunicatorUnlessSucceeded&) = delete;
  ~FailCommunicatorUnlessSucceeded() {
    if (succeeded_) return;
    communicator_->Abort();
    lost_(communicator_->LostPeers());
  }
  void Succeeded() { succeeded_ = true; }

 private:
  comm::Communicator* const communicator_;
  const std::function<void(std::vector<int>)> lost_;
  bool succeeded_ = false;
};

// The periodic checkpoints' agreement (checkpoint_schedule.h): one fp64 per rank, summed (the
// ranks whose writer is busy). A CUDA communicator reduces device memory.
class BusyRanksFlag {
 public:
  // On `device` when it is not host memory (null: the CPU). ResourceExhausted when out of
  // device memory.
  static absl::StatusOr<BusyRanksFlag> Create(engine::DeviceOps* device) {
    BusyRanksFlag flag;
    if (device != nullptr && !device->host_memory()) {
      flag.on_device_ = {device->AllocateZeroed(64),
                         [device](void* block) { device->Free(block); }};
      if (flag.on_device_ == nullptr) {
        return absl::ResourceExhaustedError(
            "out of device memory for 8 bytes (checkpoint schedule)");
      }
      flag.device_ = device;
    }
    return flag;
  }

  // Collective: whether no rank's writer is busy (`busy_here`: this rank's).
  absl::StatusOr<bool> EveryRankFree(bool busy_here, comm::Communicator& communicator,
                                     absl::Duration timeout) {
    double busy = busy_here ? 1.0 : 0.0;
    void* const buffer = on_device_ != nullptr ? on_device_.get() : &host_;
    if (on_device_ != nullptr) {
      ZS_RETURN_IF_ERROR(device_->CopyFromHost(buffer, &busy, sizeof(busy)));
    } else {
      host_ = busy;
    }
    comm::CollectiveOptions collective;
    collective.timeout = timeout;
    ZS_RETURN_IF_ERROR(
        communicator
            .AllReduce(buffer, 1, comm::ElementType::kFloat64, comm::ReduceOp::kSum, collective)
            ->Wait());
    if (on_device_ != nullptr) {
      ZS_RETURN_IF_ERROR(device_->CopyToHost(&busy, buffer, sizeof(busy)));
    } else {
      busy = host_;
    }
    return busy == 0.0;
  }

 private:
  BusyRanksFlag() = default;

  double host_ = 0.0;
  engine::DeviceOps* device_ = nullptr;  // set with on_device_
  std::unique_ptr<void, std::function<void(void*)>> on_device_;
};

// Copies a fragment of the engine's saved state (CheckpointWriter::WriteNow's source).
auto CopyFragment(engine::Engine& engine) {
  return [&engine](size_t index, int64_t first, absl::Span<char> out) {
    return engine.CopyFragmentTo(index, first, out);
  };
}

}  // namespace

std::unique_ptr<EngineTrainingRun> EngineTrainingRun::Start(const v1::Assignment& assignment,
                                                            EngineTrainingRunOptions options) {
  std::unique_ptr<EngineTrainingRun> run(new EngineTrainingRun(assignment, std::move(options)));
  run->thread_ = std::thread([raw = run.get()] { raw->Main(); });
  return run;
}

EngineTrainingRun::EngineTrainingRun(const v1::Assignment& assignment,
                                     EngineTrainingRunOptions options)
    : assignment_(assignment), options_(std::move(options)) {}

EngineTrainingRun::~EngineTrainingRun() {
  Abort();
  if (thread_.joinable()) thread_.join();
}

void EngineTrainingRun::Abort() { abort_signal_.Abort(); }

absl::Status EngineTrainingRun::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

std::vector<int32_t> EngineTrainingRun::lost_peer_ranks() const {
  absl::MutexLock lock(&mu_);
  return lost_peer_ranks_;
}

void EngineTrainingRun::Main() {
  absl::Status status = Train();
  const bool aborted = abort_signal_.aborted();
  if (!status.ok() && aborted) status = absl::AbortedError("aborted");
  // The step reached says how many steps the next generation redoes.
  if (!status.ok() && aborted) {
    ZS_LOG(INFO) << assignment_.job_id() << " generation " << assignment_.generation() << " rank "
                 << assignment_.rank() << " aborted after step " << step_.load();
  } else if (!status.ok()) {
    ZS_LOG(ERROR) << assignment_.job_id() << " generation " << assignment_.generation() << " rank "
                  << assignment_.rank() << " failed after step " << step_.load() << ": " << status;
  }
  {
    absl::MutexLock lock(&mu_);
    status_ = status;
  }
  done_.store(true);
}

absl::Status EngineTrainingRun::Commit(const v1::CommitCheckpointRequest& request) {
  // Retried through a coordinator outage: a checkpoint that every rank wrote must not be lost
  // because the coordinator restarted meanwhile. Retried often: the next checkpoint waits for
  // every rank's commit (checkpoint_schedule.h), so a retry that comes late after the
  // coordinator is back adds to the steps a lost worker redoes.
  RetryPolicy retry;
  retry.max_backoff = kCommitMaxBackoff;
  return RetryRpc(
      "CommitCheckpoint", [&] { return CommitOnce(request); },
      absl::Now() + kCoordinatorOutageDeadline,
      [this](absl::Duration delay) { return WaitUnlessAborted(delay); }, retry);
}

bool EngineTrainingRun::WaitUnlessAborted(absl::Duration delay) {
  absl::Notification aborted;
  const comm::AbortSignal::Registration wake = abort_signal_.OnAbort([&aborted] {
    if (!aborted.HasBeenNotified()) aborted.Notify();
  });
  return !aborted.WaitForNotificationWithTimeout(delay);
}

absl::Status EngineTrainingRun::CommitOnce(const v1::CommitCheckpointRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  const comm::AbortSignal::Registration cancel =
      abort_signal_.OnAbort([&context] { context.TryCancel(); });
  v1::CommitCheckpointResponse response;
  return common::FromGrpcStatus(options_.stub->CommitCheckpoint(&context, request, &response));
}

absl::StatusOr<v1::RewindJobResponse> EngineTrainingRun::Rewind(
    const v1::RewindJobRequest& request) {
  v1::RewindJobResponse response;
  RetryPolicy retry;
  retry.max_backoff = kCommitMaxBackoff;
  ZS_RETURN_IF_ERROR(RetryRpc(
      "RewindJob",
      [&]() -> absl::Status {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
        const comm::AbortSignal::Registration cancel =
            abort_signal_.OnAbort([&context] { context.TryCancel(); });
        response.Clear();
        return common::FromGrpcStatus(options_.stub->RewindJob(&context, request, &response));
      },
      absl::Now() + kCoordinatorOutageDeadline,
      [this](absl::Duration delay) { return WaitUnlessAborted(delay); }, retry));
  return response;
}

absl::StatusOr<bool> EngineTrainingRun::Report(const v1::StepMetrics& metrics, bool finished,
                                               const std::string& notice) {
  v1::ReportProgressRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_job_id(assignment_.job_id());
  request.set_generation(assignment_.generation());
  request.set_rank(assignment_.rank());
  *request.mutable_metrics() = metrics;
  request.set_finished(finished);
  request.set_notice(notice);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  v1::ReportProgressResponse response;
  {
    // An abort does not wait for a slow coordinator (the reporter's thread is joined on the way
    // out).
    const comm::AbortSignal::Registration cancel =
        abort_signal_.OnAbort([&context] { context.TryCancel(); });
    ZS_RETURN_IF_ERROR(
        common::FromGrpcStatus(options_.stub->ReportProgress(&context, request, &response)));
  }
  return response.continue_running();
}

// The parts of one run, built from the assignment by Assemble() in the order they depend on each
// other, and destroyed in reverse: on a CUDA device the device (its compute stream) outlives the
// communicator, the workload and the engine; an attached trainer's shared memory outlives the
// device that allocates from it; Abort()'s registrations go before what they abort.
struct EngineTrainingRun::RunParts {
  explicit RunParts(sharding::ShardPlan job_plan) : plan(std::move(job_plan)) {}

  const sharding::ShardPlan plan;
  int64_t world_size = 0;
  int64_t rank = 0;
  // An attached trainer runs the steps (its buffers are shared memory); otherwise a built-in
  // workload.
  bool attached = false;
  // The process's resident memory when the run began (its memory figures start there).
  int64_t vmrss_at_start_bytes = 0;

  std::unique_ptr<attach::SharedBlocks> shared_memory;
  // On the CPU it stays null (unless attached) and the engine makes its own.
  std::unique_ptr<engine::DeviceOps> device;
  std::unique_ptr<comm::CoordinatorStore> store;
  ThreadPlacement placement;  // CPU runs only
  std::unique_ptr<comm::Communicator> communicator;
  // From here Abort() ends the collectives (at once, if it came already); unregistered before
  // the communicator is destroyed.
  std::optional<comm::AbortSignal::Registration> abort_collectives;
  std::optional<FailCommunicatorUnlessSucceeded> fail_communicator;
  std::unique_ptr<workloads::Workload> workload;
  attach::AttachedTrainer* trainer = nullptr;  // the workload, when attached
  std::optional<comm::AbortSignal::Registration> abort_trainer;
  engine::EngineConfig config;
  std::unique_ptr<engine::Engine> engine;
  CommitFailures commit_failures;  // outlives the writer, whose thread records into it
  // Checkpoints: every policy.every_steps() steps from the writer's thread, and the last one
  // (which export reads) when training is over. Null without a checkpoint root.
  std::unique_ptr<CheckpointWriter> writer;
  std::unique_ptr<ProgressReporter> reporter;
  // Abort() ends the reporter's retries through a coordinator outage (unregistered before the
  // reporter goes).
  std::optional<comm::AbortSignal::Registration> cancel_reports;
};

// Where the step loop stands; an attached trainer's load moves the step.
struct EngineTrainingRun::LoopState {
  int64_t first_step = 0;
  // Built-in workloads run the job's steps; an attached trainer runs until it finishes.
  int64_t last_step = 0;
  int64_t step = 0;
  // Periodic checkpoints (checkpoint_schedule.h): at a due step the ranks agree whether every
  // writer is free; when one is still busy with the previous checkpoint, every rank defers the
  // checkpoint to the first step at which all are free. Every rank takes part, with a writer or
  // not (a worker without --checkpoint_root counts as free and writes nothing).
  // Made again when an attached trainer's load moves the job's step.
  std::optional<CheckpointSchedule> schedule;
  v1::StepMetrics last;
  // An attached trainer's state_dict() / load_state_dict(), served between steps.
  std::optional<int64_t> state_saved_at_step;  // the last save_state's step
  // The step of the last load_state whose state the job's checkpoint of that step (if any) does
  // not hold; unset when the job's checkpoint of the step is the one loaded.
  std::optional<int64_t> state_loaded_at_step;
  int64_t state_loads = 0;
  // An attached trainer's collective calls, agreed on by every rank before they run.
  std::unique_ptr<attach::CallAgreement> calls;
};

absl::Status EngineTrainingRun::Train() {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<RunParts> parts, Assemble());
  LoopState loop;
  ZS_ASSIGN_OR_RETURN(loop.first_step, Resume(*parts));
  ZS_RETURN_IF_ERROR(AssembleCheckpointsAndReports(*parts));
  ZS_RETURN_IF_ERROR(RunSteps(*parts, loop));
  ZS_RETURN_IF_ERROR(Finish(*parts, loop));
  parts->fail_communicator->Succeeded();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EngineTrainingRun::RunParts>> EngineTrainingRun::Assemble() {
  // The run's memory figures start here: its peak is measured from the process's memory now.
  if (const absl::Status reset = common::ResetPeakResidentMemory(); !reset.ok()) {
    ZS_LOG(INFO) << "vmhwm_bytes will be the process's lifetime peak: " << reset;
  }
  int64_t vmrss_at_start_bytes = 0;
  if (absl::StatusOr<common::ProcessMemory> start = common::ReadProcessMemory(); start.ok()) {
    vmrss_at_start_bytes = start->vmrss_bytes;
  }
  const v1::JobSpec& spec = assignment_.spec();
  ZS_ASSIGN_OR_RETURN(sharding::ShardPlan plan,
                      jobspec::PlanForJob(spec, assignment_.world_size()));
  if (plan.layout_hash() != assignment_.plan_layout_hash()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan_layout_hash: this worker computes ", plan.layout_hash(), ", the coordinator sent ",
        assignment_.plan_layout_hash(), " (different versions?)"));
  }
  auto parts = std::make_unique<RunParts>(std::move(plan));
  parts->world_size = assignment_.world_size();
  parts->rank = assignment_.rank();
  parts->vmrss_at_start_bytes = vmrss_at_start_bytes;
  parts->attached = spec.workload().has_attached();
  ZS_RETURN_IF_ERROR(AssembleDeviceAndCommunicator(*parts));
  ZS_RETURN_IF_ERROR(AssembleWorkload(*parts));

  ZS_ASSIGN_OR_RETURN(parts->config, EngineConfigForJob(spec, options_.threads));
  // An attached trainer sends its groups' values with every step (torch.optim's param_groups).
  if (parts->attached) parts->config.tensor_groups = TensorGroupsForPlan(spec, parts->plan);
  parts->config.device = parts->device.get();
  parts->config.bucket_pool_size = options_.bucket_pool_size;
  parts->config.memory_limit_bytes = options_.memory_limit_bytes;
  ZS_ASSIGN_OR_RETURN(parts->engine, engine::Engine::Create(parts->plan, parts->rank, parts->config,
                                                            parts->communicator.get()));
  return parts;
}

absl::Status EngineTrainingRun::AssembleDeviceAndCommunicator(RunParts& parts) {
  const bool on_cuda = options_.cuda_device >= 0;
  // An attached trainer maps the engine's buffers: they live in shared memory (memfd blocks on
  // the CPU, CUDA IPC handles on a GPU), which outlives the device that allocates from it.
  if (parts.attached && options_.attach_listen_fd < 0) {
    return absl::FailedPreconditionError(
        "workload.attached: this worker serves no attached trainers (start it with "
        "--attach_socket)");
  }
  if (on_cuda) {
    if (parts.attached) {
      ZS_ASSIGN_OR_RETURN(parts.shared_memory, CreateCudaIpcMemory(options_.cuda_device));
    }
    ZS_ASSIGN_OR_RETURN(parts.device,
                        CreateCudaDevice(options_.cuda_device, parts.shared_memory.get()));
  } else if (parts.attached) {
    parts.shared_memory = std::make_unique<attach::SharedMemoryBacking>();
    parts.device =
        std::make_unique<engine::HostDeviceOps>(options_.threads, parts.shared_memory.get());
  }

  parts.store = std::make_unique<comm::CoordinatorStore>(options_.stub, assignment_.job_id(),
                                                         assignment_.generation(),
                                                         absl::Seconds(30), &abort_signal_);
  if (on_cuda) {
    ZS_ASSIGN_OR_RETURN(
        parts.communicator,
        CreateNcclCommunicator(*parts.device, parts.store.get(), static_cast<int>(parts.rank),
                               static_cast<int>(parts.world_size)));
  } else {
    if (options_.pinning != ThreadPinning::kNone) {
      ZS_ASSIGN_OR_RETURN(const std::vector<int> cpus, AllowedCpus());
      parts.placement = PlaceThreads(options_.pinning, parts.rank, cpus);
    }
    comm::GlooCommunicatorOptions comm_options = options_.gloo;
    comm_options.rank = static_cast<int>(parts.rank);
    comm_options.world_size = static_cast<int>(parts.world_size);
    comm_options.store = parts.store.get();
    comm_options.hostname = options_.listen_host;
    comm_options.abort_signal = &abort_signal_;
    comm_options.thread_cpus.clear();
    if (parts.placement.comm_cpu.has_value()) {
      comm_options.thread_cpus.push_back(*parts.placement.comm_cpu);
    }
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> gloo,
                        comm::GlooCommunicator::Create(comm_options));
    // Under --transport=auto the link is chosen at run time: say which one the rings got.
    if (parts.world_size > 1) {
      const std::vector<int> shared = gloo->SharedMemoryPeers();
      std::string links = "TCP";
      if (gloo->transport() == comm::Transport::kShm) {
        links = "shared memory";
      } else if (!shared.empty()) {
        links = absl::StrCat("shared memory with rank(s) ", absl::StrJoin(shared, ", "),
                             " and TCP with the others");
      }
      ZS_LOG(INFO) << assignment_.job_id() << " generation " << assignment_.generation() << " rank "
                   << parts.rank << ": the rings run over " << links
                   << " (--transport=" << comm::TransportName(comm_options.transport) << ")";
    }
    parts.communicator = std::move(gloo);
  }
  parts.abort_collectives.emplace(
      abort_signal_.OnAbort([raw = parts.communicator.get()] { raw->Abort(); }));
  // A run that ends in an error fails its communicator first: a failed communicator bids its
  // peers no farewell, so they stop waiting for this rank at once (comm/peer_watch.h) instead of
  // at their collectives' timeouts. It also keeps the peers the communicator saw die, for the
  // daemon's report.
  parts.fail_communicator.emplace(parts.communicator.get(), [this](std::vector<int> lost) {
    absl::MutexLock lock(&mu_);
    lost_peer_ranks_.assign(lost.begin(), lost.end());
  });
  return absl::OkStatus();
}

absl::Status EngineTrainingRun::AssembleWorkload(RunParts& parts) {
  const v1::JobSpec& spec = assignment_.spec();
  workloads::TeacherStudentMlpOptions workload_options;
  if (!parts.attached) {
    ZS_ASSIGN_OR_RETURN(workload_options.layer_sizes,
                        sharding::ResolveLayerSizes({spec.workload().preset(),
                                                     {spec.workload().layer_sizes().begin(),
                                                      spec.workload().layer_sizes().end()}}));
  }
  workload_options.seed = spec.seed();
  workload_options.global_batch = spec.global_batch();
  workload_options.world_size = parts.world_size;
  workload_options.rank = parts.rank;
  workload_options.dataset_size = spec.workload().dataset_size();
  if (parts.attached) {
    attach::AttachedTrainerOptions trainer_options;
    trainer_options.listen_fd = options_.attach_listen_fd;
    trainer_options.peers = options_.attach_peers;
    trainer_options.job_id = assignment_.job_id();
    trainer_options.worker_name = options_.worker_name;
    trainer_options.worker_id = options_.worker_id;
    trainer_options.generation = assignment_.generation();
    trainer_options.rank = static_cast<int32_t>(parts.rank);
    trainer_options.world_size = static_cast<int32_t>(parts.world_size);
    trainer_options.layout_hash = parts.plan.layout_hash();
    trainer_options.attach_deadline = absl::Now() + options_.attach_timeout;
    trainer_options.device = parts.device.get();
    auto owned = std::make_unique<attach::AttachedTrainer>(std::move(trainer_options),
                                                           parts.shared_memory.get());
    attach::AttachedTrainer* const trainer = owned.get();
    parts.trainer = trainer;
    parts.abort_trainer.emplace(abort_signal_.OnAbort([trainer] { trainer->Abort(); }));
    ZS_RETURN_IF_ERROR(trainer->Accept());
    parts.workload = std::move(owned);
  } else if (options_.cuda_device >= 0) {
    ZS_ASSIGN_OR_RETURN(parts.workload, CreateCudaWorkload(*parts.device, workload_options));
  } else {
    ZS_ASSIGN_OR_RETURN(parts.workload, workloads::TeacherStudentMlp::Create(workload_options));
  }
  return absl::OkStatus();
}

absl::Status EngineTrainingRun::AssembleCheckpointsAndReports(RunParts& parts) {
  const v1::JobSpec& spec = assignment_.spec();
  if (!options_.checkpoint_root.empty()) {
    CheckpointWriterOptions checkpoints;
    checkpoints.root = options_.checkpoint_root;
    checkpoints.job_dir = spec.checkpoint().dir();
    v1::ShardHeader& header = checkpoints.header;
    header.set_job_id(assignment_.job_id());
    header.set_generation(assignment_.generation());
    header.set_world_size(static_cast<int32_t>(parts.world_size));
    header.set_rank(static_cast<int32_t>(parts.rank));
    header.set_layout_hash(parts.plan.layout_hash());
    header.set_optimizer(spec.optimizer().kind());
    header.set_param_dtype(spec.precision().param_dtype());
    for (const sharding::TensorSpec& tensor : parts.plan.tensors()) {
      v1::CheckpointTensor& saved = *header.add_tensors();
      saved.set_name(tensor.name);
      for (int64_t dim : tensor.shape) saved.add_shape(dim);
    }
    const absl::Span<const engine::Engine::SavedFragment> fragments =
        parts.engine->SavedFragments();
    for (const engine::Engine::SavedFragment& fragment : fragments) {
      if (header.states().empty() || header.states(header.states_size() - 1) != fragment.state) {
        header.add_states(fragment.state);
      }
    }
    checkpoints.fragments.assign(fragments.begin(), fragments.end());
    v1::CommitCheckpointRequest& commit = checkpoints.commit_template;
    commit.set_worker_id(options_.worker_id);
    commit.set_job_id(assignment_.job_id());
    commit.set_generation(assignment_.generation());
    commit.set_rank(static_cast<int32_t>(parts.rank));
    parts.writer = std::make_unique<CheckpointWriter>(
        std::move(checkpoints),
        [this, failures = &parts.commit_failures](const v1::CommitCheckpointRequest& request) {
          absl::Status committed = Commit(request);
          if (!committed.ok()) failures->Record(request.step(), committed);
          return committed;
        });
  }

  // Reports go from the reporter's thread (progress_reporter.h says why): rank 0's every step,
  // the other ranks' after their first step only (and all at the end), so the coordinator knows
  // every rank's memory while the job runs at the cost of one report per rank.
  parts.reporter = std::make_unique<ProgressReporter>(
      [this](const v1::StepMetrics& metrics, const std::string& notice) {
        return Report(metrics, /*finished=*/false, notice);
      });
  parts.cancel_reports.emplace(
      abort_signal_.OnAbort([raw = parts.reporter.get()] { raw->Cancel(); }));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EngineTrainingRun::Resume(RunParts& parts) {
  // From the checkpoint the generation resumes from, or from the initial parameters.
  const v1::JobSpec& spec = assignment_.spec();
  engine::Engine& engine = *parts.engine;
  int64_t first_step = 0;
  if (!assignment_.has_resume_from()) {
    // An attached trainer sends its model's initial values first; rank 0's then reach every
    // rank (DDP's broadcast at construction), bitwise, before any trainer reads them.
    if (parts.trainer != nullptr) {
      comm::Communicator* const communicator = parts.communicator.get();
      ZS_RETURN_IF_ERROR(parts.trainer->Welcome(
          engine, first_step, /*needs_initial_parameters=*/true,
          [communicator](float* params, int64_t elements) -> absl::Status {
            if (communicator->world_size() == 1) return absl::OkStatus();
            return communicator
                ->Broadcast(params, static_cast<size_t>(elements), comm::ElementType::kFloat32,
                            /*root=*/0)
                ->Wait();
          }));
    }
    // zero3's trainer wrote them one tensor at a time into the engine already (Welcome).
    if (parts.trainer != nullptr && parts.trainer->initialized_parameters()) return first_step;
    ZS_RETURN_IF_ERROR(engine.InitializeParameters([&](int64_t tensor, absl::Span<float> out) {
      return parts.workload->InitialParameters(tensor, out);
    }));
    return first_step;
  }
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint_root: generation ", assignment_.generation(), " resumes from step ",
        assignment_.resume_from().step(), ", but this worker has no --checkpoint_root"));
  }
  CheckpointLoadOptions load;
  load.root = options_.checkpoint_root;
  load.job_dir = spec.checkpoint().dir();
  load.job_id = assignment_.job_id();
  load.max_step = assignment_.resume_from().step();
  // Until the job commits a checkpoint of its own it starts from the one of another job that
  // JobSpec.resume_from named (the coordinator checked that job's model and ownership): that one
  // checkpoint only, from that job's directory, whatever its mode and world size were.
  const v1::CheckpointRecord& from = assignment_.resume_from();
  if (!from.job_id().empty() && from.job_id() != assignment_.job_id()) {
    load.job_dir = std::filesystem::path(from.manifest_path())
                       .parent_path()
                       .parent_path()
                       .lexically_normal()
                       .generic_string();
    load.job_id = from.job_id();
    load.min_step = load.max_step;
  }
  load.rank = static_cast<int32_t>(parts.rank);
  load.world_size = static_cast<int32_t>(parts.world_size);
  load.optimizer = spec.optimizer().kind();
  load.param_dtype = spec.precision().param_dtype();
  ZS_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded,
                      LoadCheckpoint(load, parts.plan, engine, *parts.store));
  first_step = loaded.step;
  ZS_LOG(INFO) << assignment_.job_id() << " generation " << assignment_.generation() << " rank "
               << parts.rank << " resumed from " << loaded.directory;
  if (parts.rank == 0 && !loaded.passed_over.empty()) {
    v1::StepMetrics position;
    position.set_step(first_step);
    position.set_loss_scale(engine.loss_scale());
    ZS_RETURN_IF_ERROR(Report(position, /*finished=*/false,
                              absl::StrCat(absl::StrJoin(loaded.passed_over, "; "),
                                           "; resumed from step ", first_step))
                           .status());
  }
  if (parts.trainer != nullptr) {
    ZS_RETURN_IF_ERROR(parts.trainer->Welcome(engine, first_step,
                                              /*needs_initial_parameters=*/false,
                                              /*share=*/nullptr));
  }
  return first_step;
}

absl::Status EngineTrainingRun::RunSteps(RunParts& parts, LoopState& loop) {
  // Pinned only now: the threads made so far (Gloo's event loops, the optimizer kernels' pool)
  // would otherwise inherit this thread's one CPU.
  if (parts.placement.training_cpu.has_value()) {
    ZS_RETURN_IF_ERROR(PinCurrentThread(*parts.placement.training_cpu));
  }
  const v1::CheckpointPolicy& policy = assignment_.spec().checkpoint();
  loop.last_step = parts.attached ? std::numeric_limits<int64_t>::max()
                                  : static_cast<int64_t>(assignment_.spec().steps());
  loop.step = loop.first_step;
  loop.schedule.emplace(policy.every_steps(), loop.first_step, loop.last_step);
  ZS_ASSIGN_OR_RETURN(BusyRanksFlag busy_ranks, BusyRanksFlag::Create(parts.device.get()));
  if (parts.trainer != nullptr) {
    parts.trainer->SetStateHandlers(
        {[this, &parts, &loop]() { return SaveState(parts, loop); },
         [this, &parts, &loop](const v1::LoadState& request, UniqueFd source) {
           return LoadState(parts, loop, request, std::move(source));
         }});
    // A call that only some ranks' trainers make fails every rank at once, naming it, instead
    // of leaving the others in collectives that never match (issue 37). A rank that is merely
    // slower to call is waited for as long as a collective would be.
    attach::CallAgreementOptions call_options;
    call_options.rank = static_cast<int>(parts.rank);
    call_options.world_size = static_cast<int>(parts.world_size);
    call_options.timeout = parts.config.collective_timeout;
    call_options.device = parts.device.get();
    ZS_ASSIGN_OR_RETURN(loop.calls, attach::CallAgreement::Create(parts.communicator.get(),
                                                                  std::move(call_options)));
    parts.trainer->SetCallHook(
        [calls = loop.calls.get(), &loop](attach::TrainerCall call, int64_t micro_batch) {
          return calls->Agree(call, loop.step, micro_batch);
        });
  }
  workloads::Workload& workload = *parts.workload;
  engine::Engine& engine = *parts.engine;
  for (int64_t& step = loop.step; step < loop.last_step; ++step) {
    if (abort_signal_.aborted()) return absl::AbortedError("aborted");
    ZS_ASSIGN_OR_RETURN(const bool more, workload.AwaitNextStep());
    if (!more) break;
    const CpuClocks cpu_start = CpuClocks::Read(*parts.communicator);
    const absl::Time start = absl::Now();
    ZS_ASSIGN_OR_RETURN(const double local_loss, workload.ForwardBackward(step, engine, engine));
    const absl::Time computed = absl::Now();
    if (const std::optional<double> lr = workload.LearningRate(); lr.has_value()) {
      ZS_RETURN_IF_ERROR(engine.SetLearningRate(*lr));
    }
    if (parts.trainer != nullptr && !parts.trainer->group_values().empty()) {
      ZS_RETURN_IF_ERROR(engine.SetGroupHyperparameters(parts.trainer->group_values()));
    }
    ZS_ASSIGN_OR_RETURN(const engine::StepResult result, engine.Step(local_loss));
    ZS_RETURN_IF_ERROR(workload.StepApplied(
        workloads::StepOutcome{result.skipped, result.optimizer_step, result.global_loss,
                               result.grad_norm, result.clip_coef, result.next_loss_scale},
        engine));
    IterationTimes times{computed - start, absl::Now() - start};
    const CpuClocks cpu_end = CpuClocks::Read(*parts.communicator);
    times.training_thread_cpu_ns = cpu_end.training_thread_ns - cpu_start.training_thread_ns;
    times.comm_thread_cpu_ns = cpu_end.comm_thread_ns - cpu_start.comm_thread_ns;
    times.process_cpu_ns = cpu_end.process_ns - cpu_start.process_ns;
    step_.store(step + 1);
    OutsideEngineMemory outside;
    outside.comm_staging_bytes = parts.communicator->stats().scratch_bytes;
    outside.workload_bytes = workload.BufferBytes();
    if (parts.device != nullptr) outside.kernel_tables_bytes = parts.device->KernelTableBytes();
    if (parts.writer != nullptr) outside.checkpoint_staging_bytes = parts.writer->staging_bytes();
    loop.last = MetricsFor(result, step + 1, times, outside, parts.vmrss_at_start_bytes);
    CheckpointDecision checkpoint;
    if (loop.schedule->NeedsAgreement(step + 1)) {
      ZS_ASSIGN_OR_RETURN(
          const bool free,
          busy_ranks.EveryRankFree(parts.writer != nullptr && parts.writer->Busy(),
                                   *parts.communicator, parts.config.collective_timeout));
      checkpoint = loop.schedule->Decide(step + 1, free);
      if (checkpoint.take && parts.writer != nullptr) {
        ZS_RETURN_IF_ERROR(parts.writer->Save(
            step + 1, [&](absl::Span<char> staging) { return engine.CopyStateTo(staging); }));
      }
    }
    // A kill now would redo more steps than stated so far: the larger bound goes with this
    // step's report, so that no reported step is past the bound its NOTICEs stated (the last
    // step's too: a kill after it redoes as much, and no checkpoint follows to state it).
    // Without a checkpoint root nothing is written, so there is no bound to state.
    if (std::string exposed =
            parts.writer != nullptr ? loop.schedule->NoteStep(step + 1) : std::string();
        !exposed.empty()) {
      checkpoint.notice = checkpoint.notice.empty()
                              ? std::move(exposed)
                              : absl::StrCat(checkpoint.notice, "; ", exposed);
    }
    if ((parts.rank == 0 || step == loop.first_step) &&
        (step + 1 < loop.last_step || (parts.rank == 0 && !checkpoint.notice.empty()))) {
      // At a checkpoint the report of this step goes next, ahead of any older ones still
      // waiting (progress_reporter.h): the reported progress does not lag the checkpoints.
      std::string notice = parts.rank == 0 ? std::move(checkpoint.notice) : std::string();
      ZS_ASSIGN_OR_RETURN(const bool keep_going,
                          checkpoint.take ? parts.reporter->PostLatest(loop.last, std::move(notice))
                                          : parts.reporter->Post(loop.last, std::move(notice)));
      if (!keep_going) return absl::AbortedError("the coordinator ended this generation");
    }
  }
  return absl::OkStatus();
}

absl::Status EngineTrainingRun::Finish(RunParts& parts, LoopState& loop) {
  // The coordinator must hear of every rank's finish even across its restart: the reports wait
  // for it, up to a deadline or Abort().
  const absl::Time report_deadline = absl::Now() + kCoordinatorOutageDeadline;
  ZS_ASSIGN_OR_RETURN(const bool keep_going, parts.reporter->Flush(report_deadline));
  if (!keep_going) return absl::AbortedError("the coordinator ended this generation");
  // No step ran in this generation (MetricsFor always sets a positive loss scale): a trainer
  // that finished before its first step of a job at step 0 trained nothing, which is a failure
  // saying so; a resumed generation whose trainer had nothing left to do reports where it
  // stands (the checkpoint's step) rather than empty metrics the coordinator would refuse.
  if (loop.last.loss_scale() == 0) {
    if (parts.attached && loop.step == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the trainer of rank ", parts.rank,
                       " exited before its first step (it finished without calling step())"));
    }
    loop.last.set_step(loop.step);
    loop.last.set_loss_scale(parts.engine->loss_scale());
  }
  if (const char* stop = std::getenv(kStopAfterLastStepVariable);
      stop != nullptr && std::string(stop) == "1" && !parts.attached) {
    ZS_LOG(WARNING) << assignment_.job_id() << " rank " << parts.rank << ": stopping after step "
                    << loop.step << " (" << kStopAfterLastStepVariable << ")";
    std::raise(SIGSTOP);
  }
  // A state_dict() at the last step wrote (and committed) its checkpoint already.
  if (parts.writer != nullptr && loop.state_saved_at_step != loop.step) {
    ZS_RETURN_IF_ERROR(
        parts.writer->WriteNow(loop.step, parts.engine->scalars(), CopyFragment(*parts.engine)));
    const CheckpointWriterStats written = parts.writer->stats();
    ZS_LOG(INFO) << assignment_.job_id() << " rank " << parts.rank
                 << " checkpoints: " << written.written << " written (" << written.bytes_written
                 << " bytes in " << absl::FormatDuration(written.write_time) << "), "
                 << loop.schedule->merged() << " skipped, " << written.failed << " failed, "
                 << loop.schedule->deferred() << " deferred (by up to "
                 << loop.schedule->max_deferral() << " steps)";
  }
  ZS_RETURN_IF_ERROR(RetryRpc(
      "ReportProgress (finished)", [&] { return Report(loop.last, /*finished=*/true).status(); },
      report_deadline, [this](absl::Duration delay) { return WaitUnlessAborted(delay); }));
  ZS_LOG(INFO) << assignment_.job_id() << " generation " << assignment_.generation() << " rank "
               << parts.rank << " finished " << loop.step << " steps, loss " << loop.last.loss()
               << ", counted " << loop.last.memory().total_bytes() << " bytes, peak RSS "
               << loop.last.vmhwm_bytes() << " bytes (" << loop.last.vmrss_at_start_bytes()
               << " at the start)";
  return absl::OkStatus();
}

absl::StatusOr<v1::StateSaved> EngineTrainingRun::SaveState(RunParts& parts, LoopState& loop) {
  v1::StateSaved saved;
  CheckpointWriter* const writer = parts.writer.get();
  if (writer == nullptr) {
    saved.set_refused(
        "checkpoint_root: this worker was started without --checkpoint_root, so it cannot save "
        "the optimizer state");
    return saved;
  }
  const int64_t step = loop.step;
  const std::string& job_dir = assignment_.spec().checkpoint().dir();
  writer->Flush();  // a periodic checkpoint of this step may be on its way
  std::error_code error;
  const std::string step_dir = std::filesystem::absolute(
      checkpoint::StepDir(checkpoint::JobCheckpointDir(options_.checkpoint_root, job_dir), step),
      error);
  // This rank's file and the manifest, looked at from the checkpoint root without following
  // links (checkpoint/directory.h); only this job's manifest counts.
  auto open_step_dir = [&]() -> absl::StatusOr<checkpoint::Directory> {
    ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root,
                        checkpoint::Directory::OpenRoot(options_.checkpoint_root));
    return checkpoint::OpenStepDirectory(root, job_dir, step);
  };
  auto committed = [&]() -> absl::Status {
    ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root,
                        checkpoint::Directory::OpenRoot(options_.checkpoint_root));
    return checkpoint::OpenCommittedCheckpoint(root, job_dir, step, assignment_.job_id()).status();
  };
  const absl::StatusOr<checkpoint::Directory> existing_step_dir = open_step_dir();
  const absl::StatusOr<struct stat> shard =
      existing_step_dir.ok()
          ? existing_step_dir->Stat(checkpoint::ShardFileName(
                static_cast<int32_t>(parts.rank), static_cast<int32_t>(parts.world_size)))
          : existing_step_dir.status();
  if (shard.ok() && S_ISREG(shard->st_mode)) {
    // Written at this step already (a periodic checkpoint, an earlier state_dict()): it holds
    // this state unless a load came since.
    if (loop.state_loaded_at_step == step) {
      saved.set_refused(absl::StrCat(
          "the checkpoint of step ", step,
          " was written before the state was loaded at this step: run a step before saving"));
      return saved;
    }
  } else {
    const int64_t failed_before = writer->stats().failed;
    ZS_RETURN_IF_ERROR(
        writer->WriteNow(step, parts.engine->scalars(), CopyFragment(*parts.engine)));
    if (writer->stats().failed != failed_before) {
      saved.set_refused(absl::StrCat("writing this rank's checkpoint of step ", step,
                                     " failed (the worker's log says why)"));
      return saved;
    }
  }
  loop.state_saved_at_step = step;
  // The coordinator writes the manifest once every rank committed its file.
  const absl::Time deadline = absl::Now() + kStateSaveTimeout;
  while (true) {
    const absl::Status manifest = committed();
    if (manifest.ok()) break;
    if (!absl::IsNotFound(manifest)) {
      saved.set_refused(manifest.ToString());
      return saved;
    }
    if (const absl::Status commit = parts.commit_failures.Find(step); !commit.ok()) {
      saved.set_refused(absl::StrCat("the coordinator refused this rank's checkpoint of step ",
                                     step, ": ", commit.ToString()));
      return saved;
    }
    if (absl::Now() >= deadline) {
      saved.set_refused(absl::StrCat("the checkpoint of step ", step, " got no manifest within ",
                                     absl::FormatDuration(kStateSaveTimeout),
                                     ": every rank must call state_dict() at the same step"));
      return saved;
    }
    if (!WaitUnlessAborted(kManifestPollInterval)) return absl::AbortedError("aborted");
  }
  saved.set_step(step);
  saved.set_optimizer_step(parts.engine->optimizer_step());
  saved.set_manifest(checkpoint::ManifestPath(step_dir));
  saved.set_world_size(static_cast<int32_t>(parts.world_size));
  return saved;
}

absl::Status EngineTrainingRun::MoveToLoadedStep(
    RunParts& parts, LoopState& loop, int64_t loaded_step,
    const std::optional<v1::CheckpointManifest>& loaded_checkpoint, const std::string& source,
    const std::string& store_prefix) {
  const std::string key = absl::StrCat(store_prefix, "rewound");
  // "kept": the job's checkpoint of loaded_step is the one loaded; "": it has none (any more);
  // anything else: why the rewind failed.
  std::string outcome;
  // Forward (a state from another job, or a torch-format one, at a later step): no checkpoint of
  // this job lies after the step, so there is nothing to retire, and the coordinator takes a job
  // back only (RewindJob); the reports of the steps after it simply come next.
  const bool forward = loaded_step > loop.step;
  if (parts.rank == 0 && !forward) {
    v1::RewindJobRequest rewind;
    rewind.set_worker_id(options_.worker_id);
    rewind.set_job_id(assignment_.job_id());
    rewind.set_generation(assignment_.generation());
    rewind.set_rank(0);
    rewind.set_step(loaded_step);
    if (loaded_checkpoint.has_value()) {
      rewind.set_loaded_job_id(loaded_checkpoint->job_id());
      v1::CheckpointRecord& record = *rewind.mutable_loaded_checkpoint();
      record.set_step(loaded_checkpoint->step());
      record.set_generation(loaded_checkpoint->generation());
      record.set_world_size(loaded_checkpoint->world_size());
      *record.mutable_commit_time() = loaded_checkpoint->commit_time();
    }
    std::string reason = absl::StrCat("the trainers loaded ", source, " at step ", loop.step);
    if (reason.size() > 1000) reason = absl::StrCat(reason.substr(0, 997), "...");
    rewind.set_reason(std::move(reason));
    const absl::StatusOr<v1::RewindJobResponse> rewound = Rewind(rewind);
    if (!rewound.ok()) {
      outcome = absl::StrCat("the coordinator could not move the job to step ", loaded_step, ": ",
                             rewound.status().ToString());
    } else if (rewound->has_latest_checkpoint() &&
               rewound->latest_checkpoint().step() == loaded_step) {
      outcome = "kept";
    }
    ZS_RETURN_IF_ERROR(parts.store->Set(key, outcome));
  } else if (!forward) {
    ZS_ASSIGN_OR_RETURN(outcome, parts.store->Get(key, kCoordinatorOutageDeadline));
  }
  if (outcome != "kept" && !outcome.empty()) return absl::UnavailableError(outcome);
  ZS_LOG(INFO) << assignment_.job_id() << " rank " << parts.rank << ": the job's step goes from "
               << loop.step << " to " << loaded_step << " (the loaded state's)";
  loop.step = loaded_step;
  step_.store(loop.step);
  loop.schedule.emplace(assignment_.spec().checkpoint().every_steps(), loop.step, loop.last_step);
  const bool kept = outcome == "kept";
  // The job's checkpoint of this step, if kept, holds this state: the final checkpoint need not
  // be written again, and state_dict() names it.
  loop.state_saved_at_step.reset();
  if (kept) loop.state_saved_at_step = loop.step;
  loop.state_loaded_at_step.reset();
  if (!kept) loop.state_loaded_at_step = loop.step;
  return absl::OkStatus();
}

// What one load_state source gave.
struct EngineTrainingRun::SourceLoad {
  // Why the source was refused before any rank changed its state (then nothing else is set).
  std::optional<std::string> refused;
  absl::Status status;  // the load's outcome
  // The loaded state's step, which the job's follows; unset: the state holds none.
  std::optional<int64_t> step;
  std::optional<v1::CheckpointManifest> checkpoint;  // the checkpoint loaded, if one was
};

absl::StatusOr<v1::StateLoaded> EngineTrainingRun::LoadState(RunParts& parts, LoopState& loop,
                                                             const v1::LoadState& request,
                                                             UniqueFd source) {
  v1::StateLoaded loaded;
  // Every rank counts its loads alike, so a load's verdicts have keys of their own.
  const std::string store_prefix = absl::StrCat("state-load-", ++loop.state_loads, "/");
  // What the job did so far is settled before its step moves: every rank's checkpoint in
  // flight is committed (or failed), and this rank's reports are in, so none of a step after
  // the loaded one reaches the coordinator after it took the job back.
  if (parts.writer != nullptr) parts.writer->Flush();
  {
    ZS_ASSIGN_OR_RETURN(const bool keep_going,
                        parts.reporter->Flush(absl::Now() + kCoordinatorOutageDeadline));
    if (!keep_going) return absl::AbortedError("the coordinator ended this generation");
  }
  SourceLoad load;
  if (request.source_case() == v1::LoadState::kManifest) {
    load = LoadNamedCheckpoint(parts, request, std::move(source), store_prefix);
  } else if (request.source_case() == v1::LoadState::kFullStateFile) {
    load = LoadFullStateFile(parts, request, std::move(source), store_prefix);
  } else {
    load.refused = "load_state: names no source";
  }
  if (load.refused.has_value()) {
    loaded.set_refused(*std::move(load.refused));
    return loaded;
  }
  if (!load.status.ok()) {
    if (!LoadWasRefused(load.status)) return load.status;
    loaded.set_refused(load.status.ToString());
    return loaded;
  }
  // The trainer reads the parameters once the restore's all-gathers are in. zero3 has none: the
  // trainer gathers each module when it uses it (holding every tensor here would fill the gather
  // pool, whose windows hold a few modules).
  if (parts.engine->config().mode != engine::EngineMode::kZero3) {
    for (int64_t t = 0; t < parts.plan.num_tensors(); ++t) {
      ZS_RETURN_IF_ERROR(parts.engine->Parameters(t).status());
    }
  }
  const std::string& named =
      request.has_manifest() ? request.manifest() : request.full_state_file();
  ZS_LOG(INFO) << assignment_.job_id() << " rank " << parts.rank << " loaded " << named
               << " at step " << loop.step << " (optimizer step " << parts.engine->optimizer_step()
               << ")";
  // The job's step follows the model's (issue 27).
  if (load.step.has_value()) {
    ZS_RETURN_IF_ERROR(
        MoveToLoadedStep(parts, loop, *load.step, load.checkpoint, named, store_prefix));
  }
  loaded.set_optimizer_step(parts.engine->optimizer_step());
  loaded.set_step(loop.step);
  return loaded;
}

EngineTrainingRun::SourceLoad EngineTrainingRun::LoadNamedCheckpoint(
    RunParts& parts, const v1::LoadState& request, UniqueFd source,
    const std::string& store_prefix) {
  SourceLoad result;
  const absl::StatusOr<NamedCheckpoint> named =
      LocateNamedCheckpoint(options_.checkpoint_root, request.manifest(), std::move(source));
  if (!named.ok()) {
    result.refused = std::string(named.status().message());
    return result;
  }
  CheckpointLoadOptions load;
  load.root = named->root;
  load.job_dir = named->job_dir;
  load.named_step_dir = named->step_dir;
  // Named explicitly by the trainer: it may be another job's (docs/pytorch.md).
  load.job_id = std::nullopt;
  load.min_step = load.max_step = named->step;
  load.rank = static_cast<int32_t>(parts.rank);
  load.world_size = static_cast<int32_t>(parts.world_size);
  load.optimizer = assignment_.spec().optimizer().kind();
  load.param_dtype = assignment_.spec().precision().param_dtype();
  load.store_prefix = store_prefix;
  absl::StatusOr<LoadedCheckpoint> restored =
      LoadCheckpoint(load, parts.plan, *parts.engine, *parts.store);
  result.status = restored.status();
  if (restored.ok()) {
    result.step = restored->step;
    result.checkpoint = restored->manifest;
  }
  return result;
}

EngineTrainingRun::SourceLoad EngineTrainingRun::LoadFullStateFile(
    RunParts& parts, const v1::LoadState& request, UniqueFd source,
    const std::string& store_prefix) {
  SourceLoad result;
  if (request.optimizer_step() < 0) {
    result.refused = absl::StrCat("optimizer_step: ", request.optimizer_step(), " < 0");
    return result;
  }
  if (request.tensor_steps_size() != 0 && request.tensor_steps_size() != parts.plan.num_tensors()) {
    result.refused = absl::StrCat("tensor_steps: ", request.tensor_steps_size(),
                                  " entries, the job has ", parts.plan.num_tensors(), " tensors");
    return result;
  }
  if (request.has_step() && (request.step() < 0 || request.step() >= kMaxLoadedStep)) {
    result.refused = absl::StrCat("step: ", request.step(), " is not in [0, ", kMaxLoadedStep, ")");
    return result;
  }
  for (int t = 0; t < request.tensor_steps_size(); ++t) {
    if (request.tensor_steps(t) < 0 || request.tensor_steps(t) > request.optimizer_step()) {
      result.refused =
          absl::StrCat("tensor_steps[", t, "]: ", request.tensor_steps(t),
                       " is not in [0, optimizer_step ", request.optimizer_step(), "]");
      return result;
    }
  }
  // Never opened by path: the trainer wrote it where the worker may not (issue 24).
  if (!source.valid()) {
    result.refused = absl::StrCat(
        "full_state_file: \"", request.full_state_file(),
        "\" came without its descriptor: the trainer must open the file and pass it with "
        "load_state (zeroshard.torch does; the worker opens no path on a trainer's word)");
    return result;
  }
  absl::StatusOr<checkpoint::File> file =
      checkpoint::File::FromPassedDescriptor(source.Release(), request.full_state_file());
  if (!file.ok()) {
    result.refused = absl::StrCat("full_state_file: ", file.status().message());
    return result;
  }
  FullStateLoadOptions load;
  load.path = request.full_state_file();
  load.optimizer_step = request.optimizer_step();
  load.tensor_steps.assign(request.tensor_steps().begin(), request.tensor_steps().end());
  load.rank = static_cast<int32_t>(parts.rank);
  load.world_size = static_cast<int32_t>(parts.world_size);
  load.store_prefix = store_prefix;
  result.status = LoadFullState(load, *std::move(file), parts.plan, *parts.engine, *parts.store);
  // torch.optim's state has no data position: its step (when it has one) is the model's.
  if (request.has_step()) result.step = request.step();
  return result;
}

}  // namespace zeroshard::worker
