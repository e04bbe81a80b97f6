// This rank's checkpoints, written from a thread of its own so that training does not wait for
// the disk: at a due step the training thread copies the engine's owned state into a staging
// buffer (Engine::CopyStateTo) and goes on; the writer thread streams it into the rank's shard
// file (checkpoint/shard_file.h), makes it durable and commits it to the coordinator, which
// writes the checkpoint's manifest once every rank has committed (docs/design.md,
// "Checkpoints").
#ifndef ZEROSHARD_WORKER_DAEMON_CHECKPOINT_WRITER_H_
#define ZEROSHARD_WORKER_DAEMON_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/shard_file.h"
#include "worker/engine/engine.h"
#include "zeroshard/v1/checkpoint.pb.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::worker {

struct CheckpointWriterOptions {
  // The checkpoint root (a directory every rank and the coordinator see, e.g. a ReadWriteMany
  // volume) and the job's directory under it (CheckpointPolicy.dir, relative).
  std::string root;
  std::string job_dir;
  // Every field but step, optimizer_step, loss_scale and loss_scale_good_steps, which each save
  // fills in.
  v1::ShardHeader header;
  // What the engine saves (Engine::SavedFragments), in staging order.
  std::vector<engine::Engine::SavedFragment> fragments;
  // Identifies the commits (CommitCheckpointRequest's worker, job, generation, rank).
  v1::CommitCheckpointRequest commit_template;
};

// Figures for benchmarks and the run's log.
struct CheckpointWriterStats {
  int64_t written = 0;  // committed by this rank
  int64_t failed = 0;
  int64_t bytes_written = 0;
  absl::Duration write_time;  // streaming, checksums and fsyncs of the written ones
};

// When checkpoints are taken is the caller's (checkpoint_schedule.h): a due checkpoint is taken at
// the first step at which no rank's writer is Busy(), by every rank at that same step.
//
// Thread contract: Save, Busy, Flush and stats may be called from any thread (the training thread
// in practice); the destructor waits for the write in progress and must not race other calls.
class CheckpointWriter {
 public:
  // Sends one commit (WRITTEN or FAILED) to the coordinator; called on the writer's thread only.
  using CommitFn = std::function<absl::Status(const v1::CommitCheckpointRequest&)>;
  // Fills `staging` with the engine's state and returns its scalars (Engine::CopyStateTo).
  using CopyFn = absl::FunctionRef<absl::StatusOr<engine::Engine::SavedScalars>(absl::Span<char>)>;

  CheckpointWriter(CheckpointWriterOptions options, CommitFn commit);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Takes the checkpoint of `step` (the next step to run): waits for the write in progress, if
  // any (callers take it when Busy() is false on every rank, so it does not wait), copies the
  // state with `copy` and returns once the copy is done; the writer thread writes and commits
  // it. `copy`'s error is returned (the engine failed); write errors are the writer thread's and
  // become a FAILED commit, not an error here.
  absl::Status Save(int64_t step, CopyFn copy);
  // Whether a checkpoint is still being written or committed (its commit RPC has not returned).
  bool Busy() const;
  // Waits until nothing is being written (every started checkpoint committed or failed).
  void Flush();
  // The last checkpoint of a run, when training is over: waits for a write in progress, then
  // writes the checkpoint of `step` on the calling thread, the fragments copied by
  // `copy_fragment` (Engine::CopyFragmentTo) a chunk of at most 1 MiB at a time, so no staging
  // copy of the state is made (not even of one fragment), and commits it. A failed write is a
  // FAILED commit (the job goes on); the error here is `copy_fragment`'s only.
  using CopyFragmentFn =
      absl::FunctionRef<absl::Status(size_t index, int64_t first, absl::Span<char> out)>;
  absl::Status WriteNow(int64_t step, const engine::Engine::SavedScalars& scalars,
                        CopyFragmentFn copy_fragment);

  CheckpointWriterStats stats() const;
  // Bytes of the staging buffer (MemoryBreakdown.checkpoint_staging_bytes): 0 until the first
  // Save(), which allocates it.
  int64_t staging_bytes() const;

 private:
  void WriteLoop();
  // The header of the checkpoint of `step` with the engine's `scalars`.
  v1::ShardHeader HeaderFor(int64_t step, const engine::Engine::SavedScalars& scalars) const;
  // Writes the shard file of `header.step()`, its data from `append` (every fragment's bytes in
  // order); its path, size and checksum. `copy_error` receives an error of the data's source.
  absl::StatusOr<checkpoint::WrittenFile> WriteShard(
      const v1::ShardHeader& header,
      absl::FunctionRef<absl::Status(checkpoint::ShardWriter&)> append);
  // Writes and commits (WRITTEN or FAILED); updates the stats.
  void WriteAndCommit(const v1::ShardHeader& header,
                      absl::FunctionRef<absl::Status(checkpoint::ShardWriter&)> append);
  void SendCommit(int64_t step, v1::CheckpointOutcome outcome, const std::string& message,
                  const checkpoint::WrittenFile* file);

  const CheckpointWriterOptions options_;
  const CommitFn commit_;
  const int64_t saved_bytes_;  // what one checkpoint's data holds
  // Allocated and filled by Save() while the writer is idle, read by the writer thread while it
  // is busy (busy_ orders the two: not guarded by mu_).
  std::vector<char> staging_;

  mutable absl::Mutex mu_;
  // staging_ holds a checkpoint not yet written and committed.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  v1::ShardHeader pending_ ABSL_GUARDED_BY(mu_);  // the checkpoint staging_ holds
  CheckpointWriterStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // last: starts once every member above exists
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_CHECKPOINT_WRITER_H_
