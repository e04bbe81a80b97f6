// The ZeRO engine: one rank's data path of a training step (docs/design.md, "Data plane") in ddp,
// zero1, zero2 or zero3 mode: bucketed gradient reduction overlapping backward, the global norm and
// overflow check, the fused optimizer update of the owned pieces, and the parameter all-gather
// (zero3: per bucket into a bounded gather pool, as forward and backward ask for tensors).
#ifndef ZEROSHARD_WORKER_ENGINE_ENGINE_H_
#define ZEROSHARD_WORKER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"
#include "numerics/dtype.h"
#include "sharding/shard_planner.h"
#include "worker/comm/communicator.h"
#include "worker/engine/bucket_pipeline.h"
#include "worker/engine/counting_allocator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/gather_pool.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/step_timings.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {

// ddp: gradients all-reduced, every rank updates everything (full optimizer state everywhere).
// zero1: gradients reduce-scattered into a full-size gradient buffer, optimizer state and master
// weights only for the owned pieces, parameters all-gathered. zero2: as zero1, but only in-flight
// bucket buffers and the owned gradient pieces are kept. zero3: as zero2, and the parameters too
// are kept only as the owned pieces; full values of a bucket exist only in a gather-pool buffer,
// from Parameters() of one of its tensors until the bucket is released and its buffer reused.
enum class EngineMode : int32_t {
  kDdp = 0,
  kZero1 = 1,
  kZero2 = 2,
  kZero3 = 3,
};

const char* EngineModeName(EngineMode mode);
// "ddp", "zero1", "zero2" or "zero3"; InvalidArgument otherwise.
absl::StatusOr<EngineMode> ParseEngineMode(absl::string_view name);

struct EngineConfig {
  EngineMode mode = EngineMode::kZero2;
  kernels::OptimizerConfig optimizer;
  // The full parameter copy every rank keeps (master weights are always fp32).
  numerics::DType param_dtype = numerics::DType::kFloat32;
  // How gradients are stored: as backward produced them (ddp, zero1) and the owned reduced
  // pieces the update reads (all modes).
  numerics::DType grad_dtype = numerics::DType::kFloat32;
  // The element type gradients are reduced in (docs/design.md, "Reduction dtype": fp32 by default,
  // also for bf16/fp16 gradients).
  numerics::DType reduce_dtype = numerics::DType::kFloat32;
  LossScaleConfig loss_scale;
  // The parameter group of each plan tensor: an index into SetGroupHyperparameters' list. Empty:
  // the job has no per-step group values (built-in workloads: each tensor's weight_decay and
  // lr_scale, the optimizer's lr).
  std::vector<int32_t> tensor_groups;
  // Global-norm clipping as torch.nn.utils.clip_grad_norm_ (max_norm); 0 turns it off.
  double clip_grad_norm = 0.0;
  // Threads of the optimizer kernels (results do not depend on it). Used only when `device` is
  // null (the engine then makes its own HostDeviceOps).
  int threads = 1;
  // Where the engine's buffers live and its element work runs (device_ops.h); must outlive the
  // engine, and the communicator must take buffers of that memory (NCCL for a CUDA device, issued
  // after the device's compute stream). Null: host memory and the CPU kernels.
  DeviceOps* device = nullptr;
  // Reduce-dtype bucket buffers that may be in flight at once (zero2, and ddp/zero1 when
  // grad_dtype != reduce_dtype), each of the plan's bucket size. When all are busy, GradBuffer
  // (zero2) or the bucket's launch orders the device after the oldest
  // reduction (a host wait with a host communicator; the compute stream waits with NCCL).
  int bucket_pool_size = 2;
  // Bound on every collective the engine issues.
  absl::Duration collective_timeout = absl::Minutes(5);
  // zero3: buffers of the gather pool, each of the largest bucket's size in param_dtype. 0: the
  // default, sharding::DefaultGatherPoolBuckets(plan) (twice the most buckets one module's
  // tensors span: one module in use and the next one prefetched). Ignored in other modes.
  int gather_pool_buckets = 0;
  // The most bytes the engine's counting allocator may hold at once (the worker's
  // --memory_limit_bytes); 0: no limit. Creation fails with ResourceExhausted naming the limit,
  // the allocation asked for and the mode's total need (sharding::RankMemoryNeed).
  int64_t memory_limit_bytes = 0;
};

struct StepResult {
  bool skipped = false;        // gradients held a NaN or Inf: no update was applied
  int64_t optimizer_step = 0;  // updates applied so far (skipped steps do not count)
  double global_loss = 0.0;    // mean over ranks of the local losses passed to Step()
  // L2 norm of the averaged, unscaled gradient (before clipping); NaN or Inf when skipped.
  double grad_norm = 0.0;
  double clip_coef = 1.0;        // min(1, clip / (grad_norm + 1e-6)); 1 without clipping
  double loss_scale = 1.0;       // the scale the step's gradients carried
  double next_loss_scale = 1.0;  // the scale the next step's gradients will carry
  StepTimings timings;
  MemoryReport memory;
};

// One rank's engine.
//
// Per step, the owner calls Parameters() (any number of times, during forward/backward), hands
// every tensor's gradient over segment by segment (GradSegmentEnd, GradBuffer, GradWritten: the
// workloads::GradientSink contract), then calls Step(). The gradients written are those of the
// rank's mean loss multiplied by loss_scale() (backward starts from the scaled loss gradient);
// the engine stores them in grad_dtype, in the bucket buffers themselves where the dtypes allow
// (fp32). A bucket's reduction starts when its last segment is written. Step() applies, to the
// sum over ranks g of those stored gradients,
//   grad_scale = clip_coef / (W * loss_scale),   clip_coef = min(1, clip / (norm + 1e-6)),
//   norm = sqrt(sum of squares of g) / (W * loss_scale),
// computed in double and rounded to float once, then the optimizer (kernels/optimizer.h).
//
// The parameter all-gather overlaps the next forward (zero1/zero2): Step() issues every bucket's
// all-gather, the last bucket first, and returns without waiting. Parameters(tensor) waits for
// the all-gathers of the buckets `tensor` overlaps and no others, so a forward that asks for
// each tensor just before reading it (the tensor list backwards, the last buckets first) waits
// only for what its current layer needs while the rest is still in flight. Issuing in that order
// keeps the communicator's one queue (it runs operations in issue order) in the order forward
// consumes them; every all-gather is ahead of the next backward's reductions in that queue, and
// a forward that reads every tensor has needed them all before backward starts, so no reduction
// waits behind an all-gather that forward did not need first (a tensor forward never reads
// delays the reductions by its own all-gather only). Whatever is still outstanding is waited for by
// the next Step(), InitializeParameters(), ParametersOnHost() (its tensor's buckets) and the
// destructor.
//
// Determinism: for a fixed W, ddp, zero1 and zero2 give bitwise equal parameters, and reruns are
// bitwise identical: reductions are the communicator's fixed-order rings (an all-reduce equals a
// reduce-scatter piece by piece), every mode sums the gradient statistics over the same chunks
// of the same owned fragments, one partial per chunk, added in a fixed order whatever order the
// buckets retired in, and the update is element-wise with the same grad_scale everywhere. The
// all-gathers copy bits, and Parameters() hands out only tensors whose all-gathers are done, so
// when they run does not change any result.
//
// Thread contract: not thread-safe; one owner thread calls everything except Memory(), which
// may be called from any thread. Collectives run on the communicator's thread(s). The
// communicator must outlive the engine; the destructor waits for reductions and all-gathers
// still in flight.
// REQUIRES: every method but Memory() is called from the engine's owner thread.
class Engine : public workloads::GradientSink, public workloads::ParameterSource {
 public:
  // `plan` must be for the communicator's world size and `rank` its rank. InvalidArgument
  // naming the field for a bad config or a mismatch.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const sharding::ShardPlan& plan,
                                                        int64_t rank, const EngineConfig& config,
                                                        comm::Communicator* communicator);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Fills the master weights this rank keeps and the full parameter copy from `initial`, which
  // writes every element of one tensor (the same values on every rank) into host memory. Call
  // before step 0.
  absl::Status InitializeParameters(
      absl::FunctionRef<absl::Status(int64_t tensor, absl::Span<float> out)> initial);

  // workloads::GradientSink. Segments end at bucket boundaries (and at the tensor's end).
  double loss_scale() const override { return loss_scaler_.scale(); }
  int64_t GradSegmentEnd(int64_t tensor, int64_t begin) const override;
  // The segment's place in its bucket buffer (zero2, fp32) or in the full gradient buffer (ddp,
  // zero1, fp32), or a staging buffer of one bucket when the segment must be rounded to
  // grad_dtype / reduce_dtype on the way. zero2 takes a pool buffer for the segment's bucket
  // when it has none, first retiring the oldest reduction if every buffer is in flight.
  // InvalidArgument for a bad tensor or range; FailedPrecondition out of order or while another
  // segment is open.
  absl::StatusOr<absl::Span<float>> GradBuffer(int64_t tensor, int64_t begin, int64_t end) override;
  // As GradBuffer, but nullopt instead of waiting when zero2 has no pool buffer free for the
  // segment's bucket: the reductions already done are retired first, and none is waited for.
  absl::StatusOr<std::optional<absl::Span<float>>> TryGradBuffer(int64_t tensor, int64_t begin,
                                                                 int64_t end) override;
  // Stores the open segment (rounding it when staged); when it completes its bucket, starts the
  // bucket's reduction without waiting for it. Then retires the reductions already done, so
  // their moves and gradient statistics run during backward. FailedPrecondition when
  // [begin, end) of `tensor` is not the open segment.
  absl::Status GradWritten(int64_t tensor, int64_t begin, int64_t end) override;
  // zero2 gradient accumulation (as DeepSpeed stage 2): every tensor of one micro-batch has
  // been handed over. Waits for its reductions, which leave the reduced owned pieces in the
  // gradient storage; the next micro-batch hands every tensor over again and its reduced pieces
  // are added there (in grad_dtype); Step() applies the sum, and may follow EndMicroBatch()
  // directly. Without it nothing changes: one hand-over per step, stored as before.
  // FailedPrecondition in ddp/zero1 (they accumulate before the hand-over, in the full gradient
  // buffer) or before every tensor was handed over; Unimplemented on a device without
  // DeviceOps::AddElements.
  absl::Status EndMicroBatch() override;

  // workloads::ParameterSource: the current full parameters of `tensor` as stored, in
  // param_dtype, in the engine's device memory (the parameter copy itself: no fp32 view is made
  // for bf16/fp16 parameters). Valid until the next Step(). Orders the caller after the
  // all-gathers still outstanding for the buckets `tensor` overlaps
  // (Work::WaitOnComputeStream: a host backend waits here, on a device the compute stream
  // waits), and after no other. InvalidArgument for a tensor outside the plan; a failed
  // all-gather's error, after which the engine is unusable.
  //
  // zero3: the values are in the gather pool (GatherPool), held until ReleaseParameters(tensor)
  // or the next Step(); the call gathers the tensor's module when it is not resident (a
  // collective: every rank must make the same Parameters/ReleaseParameters calls in the same
  // order) and prefetches the next modules of the recorded order. ResourceExhausted when every
  // window of the pool holds a module some tensor still holds.
  absl::StatusOr<workloads::StoredParameters> Parameters(int64_t tensor) override;
  // zero3: the tensor's values will not be read again until Parameters(tensor) is called again
  // (FailedPrecondition for a tensor not held). Other modes keep every parameter: a no-op.
  // InvalidArgument for a tensor outside the plan.
  absl::Status ReleaseParameters(int64_t tensor) override;
  // zero3, between steps: the held tensor's full values, as the caller wrote them where
  // Parameters(tensor) pointed, become this rank's owned pieces of it (and their fp32 masters).
  // Each rank writes its own pieces only: every rank writes the same values (an attached
  // trainer's opt.full_parameters() writes). FailedPrecondition in another mode, during a step,
  // or for a tensor not held.
  absl::Status WriteHeldParameters(int64_t tensor);

  // Parameters(tensor) copied into host memory and widened to fp32 (exact), one tensor at a time
  // (e.g. to write them to a file). Waits on the host for the tensor's outstanding all-gathers.
  // zero3: gathers and releases the tensor, so every rank must call it alike.
  absl::StatusOr<std::vector<float>> ParametersOnHost(int64_t tensor);

  // The base learning rate of the next Step()s' updates (each tensor's lr_scale multiplies it):
  // an attached trainer's scheduler sets it every step. InvalidArgument unless finite and >= 0.
  absl::Status SetLearningRate(double lr);
  double learning_rate() const { return optimizer_.lr; }
  // From the next Step() on, tensor t's update takes the values of
  // groups[config.tensor_groups[t]] (lr, weight_decay, betas, eps, momentum, dampening), as
  // torch.optim reads its param_groups at every step; they replace SetLearningRate's lr and the
  // tensors' weight_decay and lr_scale. FailedPrecondition when config.tensor_groups is empty;
  // InvalidArgument naming "param_groups[g]" when `groups` lacks a group the tensors name or a
  // group is not valid for the job's optimizer (kernels::ValidateGroup: the state's shape is
  // fixed). Nothing changes on an error.
  absl::Status SetGroupHyperparameters(std::vector<kernels::GroupHyperparameters> groups);

  // ddp/zero1 with fp32 gradients stored unstaged: where `tensor`'s gradient lives in the
  // full-size gradient buffer, the memory GradBuffer hands out for its segments (an attached
  // trainer's .grad views it). FailedPrecondition in zero2 or with staged gradients;
  // InvalidArgument for a tensor outside the plan.
  absl::StatusOr<float*> FullGradient(int64_t tensor) const;

  // Before Step(): the tensors this rank saw no gradient for in this step (an attached trainer's
  // `.grad is None`, as torch.optim sees it; their handed-over gradients are zeros). Step() ORs
  // the sets of all ranks, as DDP does for unused parameters: a tensor no rank has a gradient for
  // is not updated and its state and step count do not advance (torch.optim skips it). For the
  // next Step() only. InvalidArgument for a tensor outside the plan (nothing changes then).
  absl::Status SetTensorsWithoutGradient(absl::Span<const int64_t> tensors);

  // ddp, an attached trainer's end of backward (as torch's DDP leaves .grad): waits for every
  // bucket's all-reduce and divides the full gradient buffer by W in place, so that the
  // trainer's .grad views hold the averaged gradient, which it may read and change (clip) before
  // Step(). Step() then takes the buffer as it is: its statistics are summed anew from it, and it
  // divides by W no more. Also OR-s the ranks' SetTensorsWithoutGradient sets (one small
  // all-reduce) and returns the tensors no rank has a gradient for (DDP leaves their .grad None).
  // Collective (every rank calls it). FailedPrecondition outside ddp, with gradients stored in
  // another dtype than fp32, before every tensor was handed over, or twice in one step.
  absl::StatusOr<std::vector<int64_t>> AverageGradients();

  // opt.clip_grad_norm_(max_norm, norm_type), as FSDP's clip_grad_norm_: the total norm of the
  // gradient Step() would apply (averaged over ranks, unscaled), over every tensor across all
  // ranks' shards: L2 for norm_type 2, the largest |element| for norm_type infinity. The next
  // Step() multiplies the gradients by min(1, max_norm / (norm + 1e-6)) instead of
  // EngineConfig.clip_grad_norm's coefficient; StepResult::grad_norm stays the L2 norm.
  // Collective: every rank calls it with the same arguments after handing every tensor over.
  // InvalidArgument for a max_norm that is not finite and >= 0 or another norm_type;
  // FailedPrecondition before every tensor was handed over.
  absl::StatusOr<double> ClipGradNorm(double max_norm, double norm_type);

  // Finishes the step: waits for the previous step's all-gathers still outstanding and for the
  // reductions, checks the global norm and overflow, updates the owned pieces and issues the
  // parameters' all-gathers without waiting for them (see above). Every tensor must have been
  // handed to the sink. `local_loss` is this rank's mean loss (averaged over ranks for the
  // result). After a failed collective the engine is unusable: this and later calls fail.
  absl::StatusOr<StepResult> Step(double local_loss);

  // ---- Checkpoints (docs/design.md, "Checkpoints") ----
  //
  // A rank saves the fragments it owns (view().fragments(): in ddp too, where every rank holds
  // everything, so each element is saved by exactly one rank) of every array: "param" (the
  // parameters as stored, param_dtype), "master" (fp32, only for bf16/fp16 parameters) and each
  // optimizer state array under torch's name (kernels::StateArrayName). Fragments are addressed
  // as (tensor, [begin, end)) in the tensor's own element index, so they do not depend on W or on
  // the bucket size, and any world size can load them.
  struct SavedFragment {
    std::string state;  // "param", "master" or a state array's name
    int64_t tensor = 0;
    int64_t begin = 0;  // elements of the tensor
    int64_t end = 0;
    numerics::DType dtype = numerics::DType::kFloat32;
    int64_t staging_offset = 0;  // bytes into the staging layout of CopyStateTo
    int64_t bytes() const { return (end - begin) * numerics::DTypeSize(dtype); }
  };
  // The scalars a bitwise resume needs besides the arrays (the data position is the caller's).
  struct SavedScalars {
    int64_t optimizer_step = 0;
    double loss_scale = 1.0;
    int64_t good_steps = 0;  // consecutive good steps since the loss scale last changed
    // Each tensor's own step count (plan order), which differs from optimizer_step for a tensor
    // skipped in steps it had no gradient (SetTensorsWithoutGradient). Empty: every tensor is at
    // optimizer_step (what CopyStateTo returns while none was ever skipped).
    std::vector<int64_t> tensor_steps;
  };
  // What this rank saves: fixed for the engine's life, back to back in this order (by state,
  // then tensor and element), totalling SavedBytes().
  absl::Span<const SavedFragment> SavedFragments() const { return saved_fragments_; }
  int64_t SavedBytes() const { return saved_bytes_; }
  // Copies this rank's fragments into `staging` (SavedBytes() bytes of host memory) and returns
  // the scalars. Call between Step() and the next iteration's first gradient: the owned state
  // changes only in Step(). The all-gathers Step() issued may still be running (they only read
  // the owned parameters). FailedPrecondition during a step; InvalidArgument for a wrong size.
  absl::StatusOr<SavedScalars> CopyStateTo(absl::Span<char> staging);
  // Elements [first, first + out.size() / element size) of SavedFragments()[index] (counted from
  // the fragment's start) into `out` (host memory): to write a checkpoint straight from the
  // engine, a bounded chunk at a time, when training is over. InvalidArgument for a range
  // outside the fragment or a size that is not whole elements.
  absl::Status CopyFragmentTo(size_t index, int64_t first, absl::Span<char> out);
  SavedScalars scalars() const;

  // Reads the values of one range of one array for RestoreState: (state, tensor, [begin, end),
  // dtype) as in SavedFragment (staging_offset unused); `out` has exactly its bytes.
  using StateReader =
      absl::FunctionRef<absl::Status(const SavedFragment& range, absl::Span<char> out)>;
  // Instead of InitializeParameters: loads the state saved by any world size. zero1/zero2 read
  // only the ranges this rank owns and all-gather the parameters (as after a Step(): the next
  // Parameters() calls wait for them); ddp reads whole tensors. Every rank of the group must
  // call it (the all-gathers are collective). InvalidArgument for bad scalars; the reader's
  // error otherwise, after which the engine's state is undefined (create a new one).
  absl::Status RestoreState(const SavedScalars& scalars, StateReader read);
  // The ranges RestoreState reads, in its order (to check a checkpoint before loading it):
  // SavedFragments() in zero1/zero2, whole tensors of every array in ddp.
  std::vector<SavedFragment> RestoredRanges() const;

  // Bytes by category, from the counting allocator (device memory for a GPU device).
  MemoryReport Memory() const { return allocator_.Report(); }

  // zero3's gather pool (null in other modes): its windows, the buckets gathered so far and how
  // often the order of a step departed from the recorded one.
  const GatherPool* gather_pool() const { return gather_pool_.get(); }

  int64_t optimizer_step() const { return optimizer_step_; }
  // Tensor t's own step count: optimizer_step() less the steps it was skipped in.
  int64_t tensor_step(int64_t t) const { return tensor_steps_[t]; }
  const EngineConfig& config() const { return config_; }
  const sharding::ShardPlan& plan() const { return plan_; }
  const sharding::RankView& view() const { return view_; }

 private:
  // The parameter all-gather the last Step() (or RestoreState()) issued for one bucket, until
  // the host has seen its outcome.
  struct BucketGather {
    std::unique_ptr<comm::Work> work;
    // Whether the device has been ordered after `work` (by Parameters()).
    bool ordered = false;
  };

  Engine(const sharding::ShardPlan& plan, sharding::RankView view, const EngineConfig& config,
         comm::Communicator* communicator);
  // ResourceExhausted when the device is out of memory or the allocation would pass
  // config.memory_limit_bytes.
  absl::Status AllocateBuffers();
  // `status` (an AllocateBuffers failure) with what this mode needs per rank in all, by category.
  absl::Status ExplainAllocationFailure(absl::Status status) const;
  // InitializeParameters for zero3: the owned pieces (and their masters) only.
  absl::Status InitializeOwnedParameters(
      absl::FunctionRef<absl::Status(int64_t tensor, absl::Span<float> out)> initial);
  void BuildPieces();
  // Cuts every owned fragment into statistics chunks (GradStatsChunkElements() each, from the
  // fragment's start) and puts the table and its partials in device memory.
  absl::Status BuildGradStatsChunks();

  // Whether parameters need a separate fp32 master (bf16/fp16 parameters); fp32 parameters are
  // updated in place.
  bool HasMaster() const;
  // zero2 and zero3: gradients are kept as the owned pieces only (owned layout).
  bool ShardsGradients() const {
    return config_.mode == EngineMode::kZero2 || config_.mode == EngineMode::kZero3;
  }
  // zero3: the parameters too are kept as the owned pieces only (owned layout).
  bool ShardsParameters() const { return config_.mode == EngineMode::kZero3; }
  // Whether gradient segments go through grad_staging_ (rounded to grad_dtype on the way).
  bool StagesGradients() const;
  int64_t LargestBucket() const;
  // The bucket holding flat element `flat`.
  int64_t BucketOf(int64_t flat) const;
  // Whether some gradient of the current step has been handed over (or accumulated).
  bool StepInProgress() const {
    return pipeline_.accumulating() || next_tensor_ != 0 || next_element_ != 0;
  }
  // GradBuffer (`wait`) and TryGradBuffer.
  absl::StatusOr<std::optional<absl::Span<float>>> OpenGradSegment(int64_t tensor, int64_t begin,
                                                                   int64_t end, bool wait);
  // Element offset, in the owned layout, of the owned piece of `bucket`.
  int64_t OwnedOffset(int64_t bucket) const { return owned_offsets_[bucket]; }
  // The parameter at flat element `flat`, in plan layout. REQUIRES: !ShardsParameters().
  char* ParamsAt(int64_t flat) const;
  // The parameter at element `element` of the owned layout. REQUIRES: ShardsParameters().
  char* OwnedParamsAt(int64_t element) const;
  char* GradsAt(int64_t flat) const;  // ddp/zero1 only: the full-size gradient buffer

  // Waits for the outstanding all-gathers of buckets [first_bucket, first_bucket + num_buckets),
  // in issue order (the last bucket first), adding the time blocked to timer_'s param wait:
  // `on_host` waits on the host for their outcome (Work::Wait); otherwise only orders the device
  // after them (Work::WaitOnComputeStream), a host backend waiting anyway. All-gathers seen done
  // are finished (RetireGather). Fails the engine with the first failure.
  absl::Status AwaitGathers(int64_t first_bucket, int64_t num_buckets, bool on_host);
  // Records the run time of the bucket's all-gather, which is done, and drops it; its status.
  absl::Status RetireGather(int64_t bucket);
  // The one place that sets failure_ (FirstFailure::Record): keeps the first failure (of a
  // collective or of the device), after which the engine is unusable; later failures do not
  // replace the cause. Returns `status` unchanged; OK records nothing.
  absl::Status RecordFailure(absl::Status status) { return failure_.Record(std::move(status)); }
  // REQUIRES: no reduction is in flight.
  void ResetStepState();
  // FailedPrecondition naming `what` unless every tensor was handed over this step.
  absl::Status CheckHandedOver(absl::string_view what) const;
  // Steps 0 and 1 of Step(): waits for the previous step's all-gathers and for every reduction
  // (retiring them), and records their timings in reduction_timings_. Idempotent within a step
  // (AverageGradients and ClipGradNorm run it before Step()).
  absl::Status CompleteReductions();
  // Sums the owned gradients' statistics anew into stats_partials_ from the gradient storage as
  // it is (after AverageGradients the trainer may have changed it).
  absl::Status RecomputeGradStats();
  // The largest |element| of this rank's owned gradients, in the device's stats scratch.
  absl::StatusOr<double> OwnedMaxAbs();
  // Which tensors Step() updates: OR-s the ranks' SetTensorsWithoutGradient sets (one more small
  // all-reduce, only when some rank named one; `missing` is the all-reduced count) into
  // skipped_tensors_.
  absl::Status AgreeOnSkippedTensors(double missing);
  // The all-reduce of AgreeOnSkippedTensors, unconditionally.
  absl::Status AllReduceGradientMask();
  // Issues every bucket's parameter all-gather, the last bucket first (Step(), RestoreState()).
  void IssueGathers();
  // Lists what CopyStateTo saves (saved_fragments_, saved_bytes_).
  void BuildSavedFragments();
  // Where array `state` ("param", "master" or a state array's name) holds element `element` of
  // the tensor of `fragment`, an owned fragment in the owned layout of `piece` (zero1/zero2) or
  // any range of a tensor in plan layout (ddp, and "param" in every mode).
  char* StateAt(absl::string_view state, const sharding::TensorFragment& fragment,
                const sharding::OwnedPiece* piece, int64_t element) const;
  // Where element `element` (of its tensor) of saved_fragments_[index] lives in this engine.
  char* SavedAt(size_t index, int64_t element) const;

  const sharding::ShardPlan plan_;
  const sharding::RankView view_;
  const EngineConfig config_;
  // config_.optimizer with the current learning rate (SetLearningRate).
  kernels::OptimizerConfig optimizer_;
  comm::Communicator* const communicator_;
  const int64_t world_size_;
  const int64_t rank_;
  const int param_size_;  // bytes per element of each dtype
  const int grad_size_;
  const int reduce_size_;
  const int state_arrays_;
  // The engine's device: config_.device, or owned_device_ when that is null. Declared before
  // the allocator, which takes its memory from it.
  std::unique_ptr<DeviceOps> owned_device_;
  DeviceOps* const device_;

  // owned_offsets_[b]: sum of the piece sizes of buckets before b (the owned layout).
  std::vector<int64_t> owned_offsets_;
  // The first failure of a collective or of the device (RecordFailure); the engine is then
  // unusable. Declared before the bucket pipeline, which records into it.
  FirstFailure failure_;

  // Declared before the buffers, so it outlives them. Its blocks come from device_.
  CountingAllocator allocator_;
  // padded_elems of param_dtype in plan layout; zero3: owned_elems in owned layout.
  CountedBuffer params_;
  // ddp/zero1: padded_elems of grad_dtype in plan layout; zero2: owned_elems in owned layout.
  CountedBuffer grads_;
  // Only for bf16/fp16 parameters (fp32 ones are their own master). ddp: padded_elems fp32 in
  // plan layout; zero1/zero2: owned_elems fp32 in owned layout.
  CountedBuffer master_;
  // state_arrays_ fp32 buffers: padded_elems in plan layout (ddp) or owned_elems in owned layout.
  std::vector<CountedBuffer> state_;
  // fp32, the largest bucket's size: a segment on its way to a non-fp32 buffer (when
  // StagesGradients()).
  CountedBuffer grad_staging_;
  // 5 doubles: sum of squares, non-finite flag (0 or 1), loss, the group values' digest and its
  // square (0 without groups); all-reduced.
  CountedBuffer stats_buffer_;
  // The gradient statistics' chunks (kernels::GradStatsChunk, offsets in the bucket's owned
  // piece) and one fp64 partial sum of squares per chunk, in device memory; bucket b's are
  // [stats_chunk_begin_[b], stats_chunk_begin_[b + 1]). Every bucket's retirement rewrites its
  // partials, so each step's statistics are whole once every bucket has retired. The chunks
  // cover the owned fragments in bucket and flat order, the same in every mode.
  CountedBuffer stats_chunks_;
  CountedBuffer stats_partials_;
  std::vector<int64_t> stats_chunk_begin_;

  // The update's pieces (one per owned fragment; one per tensor in ddp): fixed after
  // construction.
  std::vector<kernels::UpdatePiece> update_pieces_;
  // The plan tensor of each update piece, and the group values they point at
  // (SetGroupHyperparameters; empty until then).
  std::vector<int64_t> update_piece_tensors_;
  std::vector<kernels::GroupHyperparameters> groups_;
  // How many groups config_.tensor_groups names (its largest index + 1).
  size_t groups_named_ = 0;
  // Their digest (20 bits), all-reduced with the step's statistics: ranks whose trainers sent
  // different values fail the step rather than update differently.
  uint32_t groups_digest_ = 0;

  // Step state. The communication figures of the step (and of the all-gathers since the last
  // Step()); the buckets' reductions, which write into grads_ and read the statistics' chunks
  // (declared after them, so destroyed first: it waits for the reductions still in flight).
  StepTimer timer_;
  BucketPipeline pipeline_;
  // The all-gather of each bucket (num_buckets, made at creation; zero1/zero2).
  std::vector<BucketGather> gathers_;
  // zero3: the full parameters of the modules in use. Declared after the allocator, the step
  // timer and the owned parameters it reads, so it is destroyed (waiting for its gathers) first.
  std::unique_ptr<GatherPool> gather_pool_;
  // The next segment expected: tensor next_tensor_ (num_tensors() once all arrived) at element
  // next_element_; and the segment GradBuffer handed out, until GradWritten.
  int64_t next_tensor_ = 0;
  int64_t next_element_ = 0;
  struct OpenSegment {
    int64_t tensor = 0;
    int64_t begin = 0;
    int64_t end = 0;
    int64_t bucket = 0;
    char* destination = nullptr;  // where the segment's gradient is stored
  };
  std::optional<OpenSegment> open_segment_;

  int64_t optimizer_step_ = 0;
  // Each tensor's own step count (SavedScalars::tensor_steps), and whether one was ever skipped.
  std::vector<int64_t> tensor_steps_;
  bool tensor_skipped_ever_ = false;
  // This step's SetTensorsWithoutGradient (1: no gradient here) and, once the ranks agreed in
  // Step(), the tensors no rank has a gradient for; a host buffer for the mask's all-reduce
  // (float per tensor) and its device twin. All num_tensors long, allocated at creation.
  std::vector<char> without_gradient_;
  int64_t without_gradient_count_ = 0;
  std::vector<char> skipped_tensors_;
  std::vector<float> host_gradient_mask_;
  CountedBuffer gradient_mask_;
  // The pieces this step updates (update_pieces_ less the skipped tensors', each with its
  // tensor's step), reserved at creation so a step allocates nothing.
  std::vector<kernels::UpdatePiece> step_pieces_;
  // What this step's AverageGradients / CompleteReductions / ClipGradNorm did.
  bool averaged_ = false;
  bool reductions_complete_ = false;
  StepTimings reduction_timings_;
  std::optional<double> clip_max_norm_;  // ClipGradNorm's max_norm, for this step
  double clip_norm_ = 0.0;               // ... and the norm it measured
  LossScaler loss_scaler_;

  std::vector<SavedFragment> saved_fragments_;
  // saved_piece_[f]: the index in view_.pieces() of the piece holding view_.fragments()[f]
  // (saved_fragments_ repeats the view's fragments once per array).
  std::vector<size_t> saved_piece_;
  int64_t saved_bytes_ = 0;
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_ENGINE_H_
