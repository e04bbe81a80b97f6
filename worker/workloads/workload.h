// The seam between a model (a workload) and the ZeRO engine: the workload reads the current
// parameters, runs forward and backward on its rank's micro-batch, and writes each tensor's
// gradient into the GradientSink's buffers as soon as backward produces it (gradient-ready
// order).
//
// Memory: every span crossing this seam is memory of the engine's device. On a CPU engine that is
// host memory. On a CUDA engine (worker/engine/cuda_device_ops.h) the spans hold *device*
// pointers on the engine's device: never dereference them on the host. Their contents are ordered
// on the engine's compute stream: the workload enqueues its own work on that same stream, so
// parameters read by its kernels are the current ones, and a gradient segment handed back with
// GradWritten is read by work GradWritten enqueues after the workload's kernels that wrote it.
#ifndef ZEROSHARD_WORKER_WORKLOADS_WORKLOAD_H_
#define ZEROSHARD_WORKER_WORKLOADS_WORKLOAD_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "numerics/dtype.h"

namespace zeroshard::workloads {

// One tensor's current parameters as the engine stores them: `size` elements of `dtype` (fp32,
// or raw bf16/fp16 bits) at `data`, in the engine's device memory (see above). No fp32 copy of a
// bf16/fp16 model exists: a workload computes from these, widening what it needs as it goes.
struct StoredParameters {
  const void* data = nullptr;
  numerics::DType dtype = numerics::DType::kFloat32;
  int64_t size = 0;
};

// Read access to the full model's current parameters, by tensor index of the catalog's tensor
// list (sharding/model_catalog.h), in the engine's parameter dtype.
//
// Parameters(tensor) returns once `tensor`'s values are complete, never half-gathered: the
// engine's previous step may still be all-gathering the parameters, and the call waits for the
// buckets holding `tensor`, and only those (on a CUDA engine the compute stream waits, so the
// workload's kernels queued after the call see the gathered values; the host goes on). The
// all-gathers are issued in forward order (the tensor list backwards), so a workload that asks
// for each layer's tensors just before the layer runs, in forward order, computes while the rest
// of the all-gather is still in flight. Ask again every step: the result is valid until the
// engine's next Step(), and reading a tensor without asking this step may see it half-gathered.
// An attached trainer (e.g. a PyTorch module) does the same from a pre-forward hook: before each
// module runs, it calls Parameters() for the module's tensors. Errors: InvalidArgument for a
// tensor outside the list; the error of a failed all-gather (the engine is then unusable).
//
// Thread contract: called from the thread running Workload::ForwardBackward.
//
// A sharded-parameter engine (zero3) holds a tensor's full values only between Parameters(tensor)
// and ReleaseParameters(tensor): the workload releases each tensor once the layer reading it is
// done (after forward, and again after backward, which asks again). Releasing is a promise not
// to read the values any more; sources that keep every parameter (ddp, zero1, zero2) ignore it.
// Every rank must make the same calls in the same order: in zero3 they issue collectives.
class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  virtual absl::StatusOr<StoredParameters> Parameters(int64_t tensor) = 0;
  // The values Parameters(tensor) returned will not be read again (until asked for again).
  // InvalidArgument for a tensor outside the list; FailedPrecondition for a tensor not held.
  virtual absl::Status ReleaseParameters(int64_t tensor) {
    (void)tensor;
    return absl::OkStatus();
  }
};

// out[k] = element begin + k of `params`, widened exactly to fp32, for k < count. Host memory
// only. REQUIRES: params.dtype is valid and [begin, begin + count) lies inside the tensor.
void WidenParameters(const StoredParameters& params, int64_t begin, int64_t count, float* out);

// Receives gradients, written by backward straight into the engine's buffers. A tensor's
// gradient is handed over in segments: for each segment [begin, end) of its flat (row-major)
// elements, with end = GradSegmentEnd(tensor, begin), the workload asks for the segment's
// buffer, writes every element of it, and hands it back:
//   absl::Span<float> out = GradBuffer(tensor, begin, end);   // write out[0, end - begin)
//   GradWritten(tensor, begin, end);
// A segment never crosses a bucket boundary, so backward can compute a large weight gradient in
// row blocks that follow the buckets, never holding the whole tensor's gradient. The values are
// the gradient of the rank's *mean* loss multiplied by loss_scale() (backward starts from the
// scaled loss gradient), as fp32, in the engine's device memory (see above). Tensors arrive in
// tensor-list order and the segments of a tensor in order; one segment is open at a time.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // The factor the loss gradient is multiplied by at the start of backward (mixed-precision
  // loss scaling); 1 without loss scaling.
  virtual double loss_scale() const = 0;
  // The end (tensor-local, exclusive) of the segment of `tensor` that starts at `begin`.
  virtual int64_t GradSegmentEnd(int64_t tensor, int64_t begin) const = 0;
  // Where to write elements [begin, end) of `tensor`'s gradient (a whole segment). Valid until
  // GradWritten. InvalidArgument for a bad range; FailedPrecondition out of order.
  virtual absl::StatusOr<absl::Span<float>> GradBuffer(int64_t tensor, int64_t begin,
                                                       int64_t end) = 0;
  // The segment GradBuffer returned is written; the engine may start reducing its bucket.
  virtual absl::Status GradWritten(int64_t tensor, int64_t begin, int64_t end) = 0;
  // As GradBuffer, but never waits for a reduction: nullopt when the segment needs a bucket
  // buffer and none is free yet, so that a caller that must not block (an attached trainer's
  // backward hook) keeps the gradient and asks again later. The default suits a sink whose
  // GradBuffer never waits.
  virtual absl::StatusOr<std::optional<absl::Span<float>>> TryGradBuffer(int64_t tensor,
                                                                         int64_t begin,
                                                                         int64_t end);
  // Gradient accumulation in a sink that reduces each micro-batch (zero2): every tensor's
  // gradient of one micro-batch has been handed over; the sink keeps their reduced sum, the next
  // micro-batch hands every tensor over again, its gradients are added, and the step applies the
  // sum. Unimplemented by default; FailedPrecondition before every tensor was handed over.
  virtual absl::Status EndMicroBatch();
};

// The segment loop of one tensor's gradient: for each segment [begin, end) of its `elements`
// elements, in order, takes the segment's buffer, calls write(begin, end, out) to fill it, and
// hands it back. Stops at the first error (of the sink or of `write`).
absl::Status ForEachGradSegment(
    GradientSink& sink, int64_t tensor, int64_t elements,
    absl::FunctionRef<absl::Status(int64_t begin, int64_t end, absl::Span<float> out)> write);

// Hands a whole tensor's gradient `gradient` (already multiplied by sink.loss_scale()) to `sink`
// segment by segment: a copy per segment. For tests and small tensors; a workload that computes
// large gradients writes them into the segments directly. Host memory only.
absl::Status CopyGradientToSink(GradientSink& sink, int64_t tensor,
                                absl::Span<const float> gradient);

// What the engine's update of one step came to (engine::StepResult's figures), for a workload
// that waits for it (an attached trainer).
struct StepOutcome {
  bool skipped = false;
  int64_t optimizer_step = 0;
  double global_loss = 0.0;
  double grad_norm = 0.0;
  double clip_coef = 1.0;
  double next_loss_scale = 1.0;
};

// A model that produces gradients on one rank. Not thread-safe: one step at a time.
class Workload {
 public:
  virtual ~Workload() = default;

  // The initial value of every element of `tensor` (the same on every rank and for every W).
  // `out` is host memory whatever the engine's device.
  virtual absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const = 0;

  // Forward and backward of step `step` (0-based) on this rank's micro-batch: samples
  // [rank * local_batch, (rank + 1) * local_batch) of the step's global batch. Reads each
  // tensor through `params` when forward first needs it (see ParameterSource). Writes every
  // tensor's gradient into `sink` (see GradientSink), in tensor-list order (the reverse of
  // forward order). Returns the mean loss over the micro-batch (unscaled).
  virtual absl::StatusOr<double> ForwardBackward(int64_t step, ParameterSource& params,
                                                 GradientSink& sink) = 0;

  // Bytes of the memory the workload holds for itself (a teacher's weights, activations, targets,
  // data, scratch), in whatever memory it lives, plus the most ForwardBackward allocates at once
  // beyond that. The worker reports it as its own memory category next to the engine's, so that
  // the counted total explains the process's memory. Called between steps, on the thread that
  // runs ForwardBackward.
  virtual int64_t BufferBytes() const = 0;

  // ---- Steps the workload drives (an attached trainer, worker/attach) ----
  // Blocks until the workload is ready for its next step; false when it has no more (an
  // attached trainer finished), which ends the run successfully. Built-in workloads run the
  // job's step count and return true at once.
  virtual absl::StatusOr<bool> AwaitNextStep() { return true; }
  // The base learning rate of the update of the step ForwardBackward just ran, when the
  // workload sets it (a trainer's LR scheduler); nullopt: the job's optimizer.lr.
  virtual std::optional<double> LearningRate() const { return std::nullopt; }
  // After the engine applied that step: its outcome. `params` gives the updated parameters
  // (waiting for their all-gathers). Built-in workloads ignore it.
  virtual absl::Status StepApplied(const StepOutcome& outcome, ParameterSource& params) {
    (void)outcome;
    (void)params;
    return absl::OkStatus();
  }
};

}  // namespace zeroshard::workloads

#endif  // ZEROSHARD_WORKER_WORKLOADS_WORKLOAD_H_
