// AttachedTrainer: the Workload of an attached job (docs/pytorch.md): a PyTorch trainer process
// computes forward and backward on parameters it maps from the worker's shared memory, and tells
// the worker over a unix socket when gradients are ready and when to step.
#ifndef ZEROSHARD_WORKER_ATTACH_ATTACHED_TRAINER_H_
#define ZEROSHARD_WORKER_ATTACH_ATTACHED_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "kernels/optimizer.h"
#include "worker/attach/attach_listener.h"
#include "worker/attach/call_agreement.h"
#include "worker/attach/frame_socket.h"
#include "worker/attach/shared_blocks.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"
#include "zeroshard/v1/attach.pb.h"

namespace zeroshard::attach {

struct AttachedTrainerOptions {
  // The worker's listening unix socket (not owned): the trainer's connection is accepted here,
  // from a peer `peers` allows (AttachListener::peers()).
  int listen_fd = -1;
  AttachPeerPolicy peers;
  std::string job_id;
  // This worker's name and coordinator id, said in the welcome (the trainer checks them).
  std::string worker_name;
  std::string worker_id;
  int64_t generation = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  // The plan's; a trainer whose model hashes otherwise is refused.
  uint64_t layout_hash = 0;
  // The trainer must have connected and said hello by then.
  absl::Time attach_deadline = absl::InfiniteFuture();
  // The engine's device (not owned), when its memory is not the host's (CUDA workers): the
  // worker reads the initial parameters through it, and waits for it before answering welcome,
  // place and step (the trainer then reads and writes the blocks directly). Null: host memory.
  engine::DeviceOps* device = nullptr;
};

// What the run does for the trainer's state requests between steps (state_dict() and
// load_state_dict()). Each answers with its response message; a refusal (nothing changed) is
// its `refused` text, an error ends the run. `load` gets the descriptor the load_state frame
// carried (attach.proto: the source the trainer opened), empty when none came.
struct AttachedStateHandlers {
  std::function<absl::StatusOr<v1::StateSaved>()> save;
  std::function<absl::StatusOr<v1::StateLoaded>(const v1::LoadState&, UniqueFd source)> load;
};

// Before the worker runs the collectives of a trainer's collective call (TrainerCall: a
// backward's first gradient, average_gradients, clip_grad_norm, step, save_state, load_state,
// finish), the run's AttachedCallHook agrees on it with the other ranks (CallAgreement); its
// error fails the run. `micro_batch`: the backwards ended so far in this step (zero2).
using AttachedCallHook = std::function<absl::Status(TrainerCall call, int64_t micro_batch)>;

// The protocol (proto/zeroshard/v1/attach.proto), from the worker's side:
//   Accept():   hello from the trainer of this job and rank (other trainers are refused and
//               closed; the worker keeps waiting for its own) on the backing's device kind.
//   Welcome():  the layout of the engine's shared buffers; in a first generation, the trainer's
//               initial parameter values (InitialParameters reads them).
//   per step:   AwaitNextStep() takes the trainer's first request of the step (finish ends the
//               run; save_state and load_state are served there, through the run's
//               AttachedStateHandlers); ForwardBackward() serves map_block / ready / segment /
//               written / micro_batch_done / average_gradients / clip_grad_norm until the step
//               request, handing the gradients to the engine in plan order (zero2: a segment is
//               answered at once, placed or deferred, unless the trainer asks to wait; each
//               micro-batch is reduced and accumulated); the run calls Engine::Step with
//               LearningRate(); StepApplied() answers the step request: after the
//               all-gathers, or, when the trainer asked for the overlap
//               (StepRequest.overlap_all_gather) in zero1/zero2, as soon as Engine::Step issued
//               them (step_result.parameters_pending).
//   zero3:      no full parameters: the trainer's module hooks send gather (answered with where
//               each tensor's full values are in the gather pool's block, once gathered) and
//               release, between steps and during forward and backward; gradients go by segment
//               as in zero2; step_result follows the update (nothing is all-gathered after it).
//   overlap:    until the next step's gradients, the trainer's wait_parameters (from its
//               modules' forward pre-hooks) is answered once the named tensors' all-gathers
//               are done (ParameterSource::Parameters for each, then the device): a forward
//               reads a layer while later layers are still being gathered. Before serving
//               save_state, load_state, finish or any gradient request of the next step, the
//               worker waits for every outstanding all-gather itself (WaitForAllGathers), so
//               nothing reads or writes the engine's memory under a running all-gather.
// Any error is answered to the trainer (AttachResponse.error) and ends the run.
//
// Thread contract: everything on the run's thread, except Abort() (any thread).
class AttachedTrainer final : public workloads::Workload {
 public:
  // `backing` holds the engine's memory (the blocks the trainer maps); it must outlive this.
  AttachedTrainer(AttachedTrainerOptions options, SharedBlocks* backing);
  ~AttachedTrainer() override;

  // Waits for this rank's trainer. DEADLINE_EXCEEDED at options.attach_deadline (on time: no
  // read here blocks), CANCELLED on Abort(). Any other connection costs only itself: a hello of
  // another job, rank, world size, layout hash or device kind is refused (and told why); one
  // whose hello frame has not come whole within 2 s of its first byte, or 10 s of its accept, is
  // closed; at most 16 wait at once, a new one evicting the oldest of the user holding the most.
  // A connection whose trainer hung up after its hello (a trainer of an earlier attempt, still
  // in the listen backlog) is skipped.
  absl::Status Accept();
  // Rank 0's initial parameters to every rank, in place: `params` is the engine's whole flat
  // parameter buffer (`elements` fp32, in the engine's memory: a device's for a CUDA engine).
  using ShareInitialParameters = std::function<absl::Status(float* params, int64_t elements)>;
  // Sends the welcome for `engine` (whose memory is the backing's). With
  // `needs_initial_parameters`, waits for the trainer's initial values, has `share` make every
  // rank's rank 0's (as DDP broadcasts rank 0's module at construction: a script that seeds each
  // rank differently still trains one model) and copies them, and only then answers the
  // trainer, whose parameters become views of that buffer. A resumed generation (no
  // initial parameters) keeps the checkpoint's values and never calls `share`.
  // zero3 keeps no full copy: there Welcome initializes the engine's parameters itself, tensor by
  // tensor (attach.proto, initial_tensor), and initialized_parameters() says so.
  absl::Status Welcome(engine::Engine& engine, int64_t start_step, bool needs_initial_parameters,
                       const ShareInitialParameters& share);
  bool initialized_parameters() const { return initialized_parameters_; }
  // Ends a wait for the trainer (Accept, or a request) with CANCELLED.
  void Abort();
  // Serves save_state / load_state from now on (without them, they are refused).
  void SetStateHandlers(AttachedStateHandlers handlers);
  // Agrees on every collective call from now on (without it, none is agreed on).
  void SetCallHook(AttachedCallHook hook) { call_hook_ = std::move(hook); }
  // Lets map_block serve `block` as if the welcome or a `place` had named it (protocol tests
  // without an engine).
  void AllowMapBlockForTesting(int32_t block) { mappable_blocks_.insert(block); }
  // Protocol tests without an engine: the plan has `num_tensors` tensors, and StepApplied acts
  // as after a step request with overlap_all_gather = `overlap` in zero1/zero2.
  void SetStepForTesting(int32_t num_tensors, bool overlap) {
    num_tensors_ = num_tensors;
    overlap_requested_ = overlap;
    gathers_issued_ = true;
  }

  // workloads::Workload.
  absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const override;
  absl::StatusOr<double> ForwardBackward(int64_t step, workloads::ParameterSource& params,
                                         workloads::GradientSink& sink) override;
  int64_t BufferBytes() const override;
  absl::StatusOr<bool> AwaitNextStep() override;
  std::optional<double> LearningRate() const override { return lr_; }
  // The groups' values the last step request carried (StepRequest.param_groups), in its order;
  // empty when it carried none. The run hands them to Engine::SetGroupHyperparameters.
  const std::vector<kernels::GroupHyperparameters>& group_values() const { return group_values_; }
  absl::Status StepApplied(const workloads::StepOutcome& outcome,
                           workloads::ParameterSource& params) override;

 private:
  // Reads the next request (into pending_).
  absl::Status ReadRequest();
  // Answers `status`'s error to the trainer (best effort) and returns it.
  absl::Status Fail(absl::Status status);
  absl::Status Reply(const v1::AttachResponse& response, int pass_fd = -1);
  absl::Status Ack();
  absl::Status MapBlock(const v1::MapBlock& request);
  // Waits until the device has done everything queued on the engine's memory (CUDA workers),
  // before the trainer is told it may read or write the blocks.
  absl::Status WaitForDevice();
  // The next request that is not map_block (each map_block is served on the way).
  absl::StatusOr<v1::AttachRequest> ReadSkippingMapBlock();
  // zero3's first generation: one tensor's initial values, written by the trainer into `out`
  // (the engine's staging, in its gather pool), then rank 0's made every rank's by `share`.
  absl::Status ReceiveInitialTensor(int32_t tensor, absl::Span<float> out,
                                    const ShareInitialParameters& share);
  // zero3: serves gather (answered with where each tensor is, once gathered) and release.
  absl::Status Gather(const v1::GatherParameters& request);
  absl::Status Release(const v1::ReleaseParameters& request);
  // zero3, between steps: the held tensors' values in the pool become the owned pieces.
  absl::Status WriteBack(const v1::WriteParameters& request);
  // Serves wait_parameters: answers once the named tensors' all-gathers are done.
  absl::Status WaitParameters(const v1::WaitParameters& request);
  // Waits for every all-gather still outstanding since a step_result that did not wait for
  // them (a no-op otherwise); afterwards none is outstanding.
  absl::Status WaitForAllGathers();
  // The call hook's verdict on `call` (OK without a hook).
  absl::Status AgreeOn(TrainerCall call);
  // The first hand-over of this backward's gradients (once per micro-batch in zero2, per step
  // in ddp/zero1) is agreed on before the engine reduces any of them.
  absl::Status AgreeOnHandOver();
  // Serves a save_state or load_state request (between steps).
  absl::Status ServeStateRequest(const v1::AttachRequest& request);
  // ddp/zero1: hands tensors to the engine in plan order while the next one is ready.
  absl::Status HandOverReady(workloads::GradientSink& sink);
  absl::Status HandOver(workloads::GradientSink& sink, int32_t tensor);
  // Before average_gradients, clip_grad_norm and step: ddp/zero1 hand over the tensors not yet
  // marked ready as their buffers are; zero2 requires every tensor handed over (FailedPrecondition
  // naming `what` otherwise).
  absl::Status HandOverRest(workloads::GradientSink& sink, const char* what);

  const AttachedTrainerOptions options_;
  SharedBlocks* const backing_;
  std::unique_ptr<FrameSocket> socket_;
  absl::Mutex abort_mu_;
  bool aborted_ ABSL_GUARDED_BY(abort_mu_) = false;

  // From the engine, at Welcome (the engine outlives the run's use of this trainer): the
  // requests on the reduced gradients (average_gradients, clip_grad_norm) and the step's
  // tensors without a gradient go to it.
  engine::Engine* engine_ = nullptr;
  // zero2 and zero3 hand gradients over by segment into bucket buffers; zero3 keeps no full
  // parameters (the trainer gathers and releases each module, in the engine's gather pool,
  // block gather_pool_block_).
  bool by_segment_ = false;
  bool zero3_ = false;
  int32_t gather_pool_block_ = -1;
  // zero3: Welcome initialized the engine's parameters itself (one tensor at a time).
  bool initialized_parameters_ = false;
  int32_t num_tensors_ = 0;
  std::vector<int64_t> tensor_elements_;
  std::vector<float*> full_gradients_;  // ddp/zero1: each tensor's gradient view
  std::vector<std::vector<float>> initial_;
  // The blocks map_block serves: the welcome's parameter and gradient blocks, and each bucket
  // buffer's once `place` named it.
  std::set<int32_t> mappable_blocks_;

  // The request being served, if read but not yet handled, and the descriptor a pending
  // load_state carried.
  std::optional<v1::AttachRequest> pending_;
  UniqueFd pending_fd_;
  // This step: tensors marked ready (ddp/zero1), the next tensor to hand over, the open zero2
  // segment.
  std::vector<bool> ready_;
  int32_t next_tensor_ = 0;
  std::optional<v1::GradientSegment> open_segment_;
  // zero2 gradient accumulation: micro-batches ended this step, and whether a segment of the
  // current micro-batch was written.
  int32_t micro_batches_ended_ = 0;
  bool micro_batch_begun_ = false;
  std::optional<double> lr_;
  std::vector<kernels::GroupHyperparameters> group_values_;
  // The last step request's overlap_all_gather, and whether that step issues all-gathers
  // (zero1/zero2; ddp has none).
  bool overlap_requested_ = false;
  bool gathers_issued_ = false;
  // Where the all-gathers that a step_result did not wait for are waited for (the engine, which
  // outlives the run's use of this trainer); null while none is outstanding.
  workloads::ParameterSource* outstanding_gathers_ = nullptr;
  AttachedStateHandlers state_handlers_;
  AttachedCallHook call_hook_;
  // Whether this backward's hand-over (this micro-batch's in zero2, this step's in ddp/zero1)
  // was agreed on.
  bool hand_over_agreed_ = false;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_ATTACHED_TRAINER_H_
