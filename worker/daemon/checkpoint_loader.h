// Loading the checkpoint a generation resumes from (or an attached trainer loads), at this
// generation's world size, or a full state file an attached trainer wrote: every rank
// checks the ranges it will read (checksums, the model), the ranks agree through the rendezvous
// store, and a checkpoint that fails anywhere is passed over for the previous committed one
// (docs/design.md, "Checkpoints").
#ifndef ZEROSHARD_WORKER_DAEMON_CHECKPOINT_LOADER_H_
#define ZEROSHARD_WORKER_DAEMON_CHECKPOINT_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "checkpoint/directory.h"
#include "common/unique_fd.h"
#include "sharding/shard_planner.h"
#include "worker/comm/store.h"
#include "worker/engine/engine.h"
#include "zeroshard/v1/checkpoint.pb.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/types.pb.h"

namespace zeroshard::worker {

struct CheckpointLoadOptions {
  // The checkpoint root (trusted: opened by path, checkpoint::Directory::OpenRoot) and the job's
  // checkpoint directory under it (CheckpointPolicy.dir; "" for the root itself), walked from the
  // root without following links: a link on the way or in a checkpoint is refused.
  std::string root;
  std::string job_dir;
  // The job whose checkpoints may be loaded: a manifest of another job is passed over and
  // reported, never loaded. std::nullopt: any job's, only for a checkpoint a trainer names
  // explicitly (load_state_dict of another job's state dict, LocateNamedCheckpoint).
  std::optional<std::string> job_id;
  // A step directory the trainer opened and passed over the attach socket (a checkpoint it named
  // explicitly, LocateNamedCheckpoint): the only candidate, of step max_step; root and job_dir
  // are unused. Null: the checkpoints of root/job_dir.
  std::shared_ptr<const checkpoint::Directory> named_step_dir;
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
  // Its manifest (which checkpoint it was: job, step, generation, commit time).
  v1::CheckpointManifest manifest;
  // One line per checkpoint passed over, naming the rank and why, and per step entry refused
  // (a link, another job's manifest), naming it (for a NOTICE event).
  std::vector<std::string> passed_over;
};

// Restores `engine` (freshly created, before any step) from the newest committed checkpoint of
// options.job_dir, newest by (generation, step) as checkpoint::ListCheckpoints orders them, at or
// before options.max_step that every rank can read. Every rank of the
// generation must call it with the same options but its own rank; `store` is the generation's
// rendezvous store (keys "<store_prefix>checkpoint/<step>/<rank>"). FAILED_PRECONDITION naming the
// tensor or field when a checkpoint holds another model, optimizer or parameter dtype (that is not
// corruption: nothing older is tried); DATA_LOSS listing each checkpoint and why when none is
// usable; the store's or the engine's error otherwise.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const CheckpointLoadOptions& options,
                                                const sharding::ShardPlan& plan,
                                                engine::Engine& engine, comm::Store& store);

// Where an attached trainer's load_state_dict finds the checkpoint it names by the absolute path
// of its manifest.json.
struct NamedCheckpoint {
  std::string root;     // opened as a trusted root (when step_dir is null)
  std::string job_dir;  // below root, walked without following links ("" for root itself)
  int64_t step = 0;
  // The step directory the trainer passed, when it did: read through it, never by path.
  std::shared_ptr<const checkpoint::Directory> step_dir;
};

// With `passed_step_dir` (the descriptor of the step directory the trainer opened and passed
// with its request), the checkpoint is read through it: the trainer opened it with its own
// permissions, and the path only names it in messages. Without one, a manifest path under
// `checkpoint_root` (lexically) is walked from that root, one component at a time without
// following links, like the job's own checkpoints; a path elsewhere is refused: the worker
// opens nothing outside its checkpoint root on a trainer's word (issue 24). A passed directory
// may have any name (a step directory copied under a name of the user's): its manifest gives
// the step. INVALID_ARGUMENT naming the path when it is not the absolute path of a
// manifest.json, is not in a step-<step> directory or outside the root without a descriptor,
// or the descriptor is not a directory or holds no readable manifest.
absl::StatusOr<NamedCheckpoint> LocateNamedCheckpoint(absl::string_view checkpoint_root,
                                                      absl::string_view manifest_path,
                                                      UniqueFd passed_step_dir);

struct FullStateLoadOptions {
  // The file's path, for messages (the file itself comes open: LoadFullState's `file`).
  std::string path;
  int64_t optimizer_step = 0;
  // Each tensor's own step (plan order), or empty: every tensor at optimizer_step.
  std::vector<int64_t> tensor_steps;
  int32_t rank = 0;
  int32_t world_size = 1;
  // Prepended to the rendezvous store's keys (one load's verdicts).
  std::string store_prefix;
  absl::Duration agreement_timeout = absl::Minutes(2);
};

// Restores `engine` (between steps) from a full state file: `file` is a safetensors file of
// whole F32 tensors named "<state>/<tensor>" (SavedFragment's state, the plan's tensor name),
// "param" and every state array the engine saves; attached trainers pass it open. Each rank
// reads the ranges it restores. Every rank checks its ranges first (the file opens, each tensor is
// there, F32, of the tensor's size) and the ranks agree through `store`: FAILED_PRECONDITION naming
// the rank, tensor and state when any refuses, with the engine unchanged. Every rank of the
// generation must call it with the same file contents and options but its own rank.
absl::Status LoadFullState(const FullStateLoadOptions& options, checkpoint::File file,
                           const sharding::ShardPlan& plan, engine::Engine& engine,
                           comm::Store& store);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_CHECKPOINT_LOADER_H_
