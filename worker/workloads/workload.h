// The seam between a model (a workload) and the ZeRO engine: the workload reads the current
// parameters, runs forward and backward on its rank's micro-batch, and hands each tensor's
// gradient to a GradientSink as soon as backward produces it (gradient-ready order).
//
// Memory: every span crossing this seam is memory of the engine's device. On a CPU engine that is
// host memory. On a CUDA engine (worker/engine/cuda_device_ops.h) the spans hold *device*
// pointers on the engine's device: never dereference them on the host. Their contents are ordered
// on the engine's compute stream: the workload enqueues its own work on that same stream, so
// parameters read by its kernels are the current ones, and a gradient handed to GradReady is read
// by work GradReady enqueues before anything the workload enqueues after the call (which may then
// overwrite the gradient's buffer).
#ifndef ZEROSHARD_WORKER_WORKLOADS_WORKLOAD_H_
#define ZEROSHARD_WORKER_WORKLOADS_WORKLOAD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zeroshard::workloads {

// Read access to the full model's current parameters, by tensor index of the catalog's tensor
// list (sharding/model_catalog.h). Values are fp32 (the engine widens bf16/fp16 copies), in the
// engine's device memory (see above).
class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  virtual absl::Span<const float> Parameters(int64_t tensor) = 0;
};

// Receives gradients. `gradient` has the tensor's element count and is the gradient of the
// rank's *mean* loss over its micro-batch, in the engine's device memory (see above); it is only
// read during the call (on a CUDA device: by work queued on the compute stream during the call).
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  virtual absl::Status GradReady(int64_t tensor, absl::Span<const float> gradient) = 0;
};

// A model that produces gradients on one rank. Not thread-safe: one step at a time.
class Workload {
 public:
  virtual ~Workload() = default;

  // The initial value of every element of `tensor` (the same on every rank and for every W).
  // `out` is host memory whatever the engine's device.
  virtual absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const = 0;

  // Forward and backward of step `step` (0-based) on this rank's micro-batch: samples
  // [rank * local_batch, (rank + 1) * local_batch) of the step's global batch. Calls
  // sink->GradReady once per tensor, in tensor-list order (the reverse of forward order).
  // Returns the mean loss over the micro-batch.
  virtual absl::StatusOr<double> ForwardBackward(int64_t step, ParameterSource& params,
                                                 GradientSink& sink) = 0;
};

}  // namespace zeroshard::workloads

#endif  // ZEROSHARD_WORKER_WORKLOADS_WORKLOAD_H_
