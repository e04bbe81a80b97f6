// Loading the checkpoint a generation resumes from (or an attached trainer loads), at this
// generation's world size, or a full state file an attached trainer wrote: every rank
// checks the ranges it will read (checksums, the model), the ranks agree through the rendezvous
// store, and a checkpoint that fails anywhere is passed over for the previous committed one
// (docs/design.md, "Checkpoints").
#ifndef ZEROSHARD_WORKER_DAEMON_CHECKPOINT_LOADER_H_
#define ZEROSHARD_WORKER_DAEMON_CHECKPOINT_LOADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sharding/shard_planner.h"
#include "worker/comm/store.h"
#include "worker/engine/engine.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/types.pb.h"

namespace zeroshard::worker {

struct CheckpointLoadOptions {
  // The job's checkpoint directory (checkpoint::JobCheckpointDir).
  std::string job_dir;
  // The newest step to consider: the generation's resume_from.
  int64_t max_step = 0;
  // The oldest step to consider (an attached trainer's load_state_dict names one checkpoint:
  // min_step = max_step).
  int64_t min_step = 0;
  // Prepended to the rendezvous store's keys, so that loads later in a generation do not read
  // the verdicts of an earlier one.
  std::string store_prefix;
  int32_t rank = 0;
  int32_t world_size = 1;
  // What the engine stores, to refuse a checkpoint of another optimizer or parameter dtype.
  v1::OptimizerKind optimizer = v1::OPTIMIZER_KIND_UNSPECIFIED;
  v1::DType param_dtype = v1::FLOAT32;
  // How long a rank waits for the others' verdict on one checkpoint.
  absl::Duration agreement_timeout = absl::Minutes(2);
};

struct LoadedCheckpoint {
  int64_t step = 0;  // the data position: the next step to run
  std::string directory;
  // One line per checkpoint passed over, naming the rank and why (for a NOTICE event).
  std::vector<std::string> passed_over;
};

// Restores `engine` (freshly created, before any step) from the newest committed checkpoint of
// options.job_dir at or before options.max_step that every rank can read. Every rank of the
// generation must call it with the same options but its own rank; `store` is the generation's
// rendezvous store (keys "<store_prefix>checkpoint/<step>/<rank>"). FAILED_PRECONDITION naming the
// tensor or field when a checkpoint holds another model, optimizer or parameter dtype (that is not
// corruption: nothing older is tried); DATA_LOSS listing each checkpoint and why when none is
// usable; the store's or the engine's error otherwise.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const CheckpointLoadOptions& options,
                                                const sharding::ShardPlan& plan,
                                                engine::Engine& engine, comm::Store& store);

struct FullStateLoadOptions {
  // A safetensors file of whole F32 tensors named "<state>/<tensor>" (SavedFragment's state,
  // the plan's tensor name): "param" and every state array the engine saves.
  std::string path;
  int64_t optimizer_step = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  // Prepended to the rendezvous store's keys (one load's verdicts).
  std::string store_prefix;
  absl::Duration agreement_timeout = absl::Minutes(2);
};

// Restores `engine` (between steps) from a full state file, each rank reading the ranges it
// restores. Every rank checks its ranges first (the file opens, each tensor is there, F32, of
// the tensor's size) and the ranks agree through `store`: FAILED_PRECONDITION naming the rank,
// tensor and state when any refuses, with the engine unchanged. Every rank of the generation
// must call it with the same file contents and options but its own rank.
absl::Status LoadFullState(const FullStateLoadOptions& options, const sharding::ShardPlan& plan,
                           engine::Engine& engine, comm::Store& store);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_CHECKPOINT_LOADER_H_
