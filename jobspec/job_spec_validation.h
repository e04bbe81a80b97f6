// Validation of a JobSpec with its defaults applied, and of checkpoint paths: every bad value
// gets INVALID_ARGUMENT with a message that names the field, what is wrong and what is allowed.
#ifndef ZEROSHARD_JOBSPEC_JOB_SPEC_VALIDATION_H_
#define ZEROSHARD_JOBSPEC_JOB_SPEC_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::jobspec {

// The longest checkpoint path accepted (job.proto's bucket and world-size bounds are the shard
// planner's kMinBucketElems, kMaxBucketElems and kMaxWorldSize).
inline constexpr size_t kMaxCheckpointPathBytes = 4096;

// The longest workload.preset accepted: preset names are short words; a longer one is refused
// without being echoed.
inline constexpr size_t kMaxPresetBytes = 64;

// The largest gather pool (JobSpec.gather_pool_buckets) accepted; its smallest is the most
// buckets one module spans (PlanForJob checks it, since it needs the plan).
inline constexpr int64_t kMaxGatherPoolBuckets = 65536;

// Bounds on an attached model (workload.attached, job.proto).
inline constexpr int kMaxAttachedTensors = 100000;
inline constexpr size_t kMaxAttachedTensorNameLength = 256;
// Aliases (AttachedTensor.aliases) of all tensors together.
inline constexpr int kMaxAttachedAliases = 100000;
inline constexpr int64_t kMaxAttachedElements = int64_t{1} << 34;

// Validates `spec` as WithDefaults returns it: unset optional fields already hold their
// defaults, so every field is judged by its value against the range job.proto documents. Fields
// are checked in proto order and the first error is returned; the message starts with the
// field's full path, e.g. `optimizer.lr: -0.1 is out of range (0, 10]`.
//
// Optimizer fields that do not apply to `optimizer.kind` (momentum on ADAM, amsgrad on SGD, ...)
// must be left unset. After WithDefaults that is indistinguishable from setting them to their
// default, so a field that does not apply is rejected when it differs from the value WithDefaults
// gives it for that kind, and accepted when equal.
//
// An empty `checkpoint.dir` is accepted: it stands for the job id, which WithDefaults fills in
// when it is given one (the coordinator mints the id after validation).
//
// An attached spec (workload.attached set) follows rules of its own: no preset or layer_sizes,
// no dataset_size, fp32 parameters, min_workers = max_workers = the number of pinned workers,
// steps 0 (no fixed count), no global_batch, and no ZERO3 (attached zero3 is not built yet). Its
// messages name the element with its index, e.g. `workload.attached.tensors[3].shape[1]: must be >=
// 1, got 0`.
absl::Status ValidateJobSpec(const zeroshard::v1::JobSpec& spec);

// A path under the checkpoint root: relative (no leading '/'), at most kMaxCheckpointPathBytes
// bytes, non-empty, no empty, "." or ".." components (so no "a//b" and no trailing '/'), and no
// control characters (NUL included). Messages start with `field_path`.
absl::Status ValidateCheckpointPath(absl::string_view path, absl::string_view field_path = "path");

}  // namespace zeroshard::jobspec

#endif  // ZEROSHARD_JOBSPEC_JOB_SPEC_VALIDATION_H_
