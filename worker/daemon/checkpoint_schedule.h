// When a run takes its periodic checkpoints: every `every_steps` steps, and a due checkpoint that
// finds some rank's writer still busy with the previous one is deferred, not dropped: it is taken
// at the first later step at which every rank's writer is free. The ranks decide together (an
// all-reduce of "my writer is busy" at each due or deferred step), so they all take it at the
// same step; a checkpoint taken by some ranks only could never complete.
#ifndef ZEROSHARD_WORKER_DAEMON_CHECKPOINT_SCHEDULE_H_
#define ZEROSHARD_WORKER_DAEMON_CHECKPOINT_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>

namespace zeroshard::worker {

// What to do after a step whose agreement was asked for (see CheckpointSchedule).
struct CheckpointDecision {
  // Take the checkpoint of this step now.
  bool take = false;
  // The first due step this checkpoint stands for (== the step unless it was deferred).
  int64_t due_step = 0;
  // Due steps that passed while it was deferred (a whole interval went by): this checkpoint
  // stands for them too.
  int64_t merged = 0;
  // The step the previous checkpoint was taken at (the run's first step before its first one).
  int64_t previous_step = 0;
  // Not empty when a deferred checkpoint stretches the bound on redone steps past what this run
  // said so far: rank 0 sends it as a NOTICE (the first deferral, then each time the bound grows
  // by half again, so a job with slow writes gets a few notices, not one per checkpoint).
  std::string notice;
};

// Pure bookkeeping; the caller runs the agreement. Steps are counted as steps done, the data
// position a checkpoint of that moment resumes from. Thread contract: one thread (the run's).
//
// The bound it gives (docs/operations.md, "Checkpoints, resume and recovery"): let S be the most
// steps training runs while one checkpoint is written and committed. A checkpoint is due every
// `every_steps` steps and taken at most max(every_steps, S + 1) steps after the previous one, so
// a lost worker redoes at most max(every_steps, S + 1) + S steps: every_steps + S while writes
// take fewer steps than the interval.
//
// S is only known once a write is done, so the bound the run states is kept ahead of what a kill
// could cost now (issue 36): at every step, NoteStep() compares the steps since the newest
// checkpoint certainly committed (the one taken before the latest: the latest may still be in
// flight) with the bound stated so far (2 * every_steps before any notice, the documented bound
// while writes take fewer steps than the interval; the last step, when a multiple of every_steps,
// takes no checkpoint of its own) and, when they pass it, states a larger
// one before the step is reported. So no kill, also one after the job's last step (where the
// write in flight is never followed by another checkpoint), redoes more than the bound its
// NOTICEs stated. (A checkpoint that failed is not committed: its own NOTICE says so.)
class CheckpointSchedule {
 public:
  // `every_steps` 0: no periodic checkpoints. The run starts after `first_step` steps (the
  // checkpoint it resumed from, or 0); steps at or after `last_step` take none (the run's final
  // checkpoint is written anyway).
  CheckpointSchedule(int64_t every_steps, int64_t first_step, int64_t last_step);

  // Whether, after `steps_done` steps, the ranks must agree whether every writer is free: a
  // checkpoint is due at this step or deferred from an earlier one. The same on every rank.
  bool NeedsAgreement(int64_t steps_done) const;
  // The agreement's outcome at a step NeedsAgreement() asked for: take the checkpoint now (every
  // writer is free) or defer it to the next step.
  CheckpointDecision Decide(int64_t steps_done, bool every_writer_free);
  // After every step (`steps_done`, the last one included, after Decide if it was asked for):
  // not empty when a kill now would redo more steps than the bound stated so far; rank 0 sends
  // it as a NOTICE with this step's report. It states a bound half as large again (at least).
  std::string NoteStep(int64_t steps_done);
  // The largest bound on redone steps stated so far (the documented 2 * every_steps before any
  // notice; 0 without periodic checkpoints).
  int64_t stated_bound() const;

  // Checkpoints taken later than their due step, and the largest delay, in steps.
  int64_t deferred() const { return deferred_; }
  int64_t max_deferral() const { return max_deferral_; }
  // Due steps merged into a later checkpoint (CheckpointDecision::merged, summed).
  int64_t merged() const { return merged_; }

 private:
  bool Due(int64_t steps_done) const;

  const int64_t every_steps_;
  const int64_t last_step_;
  // The first due step not taken yet, while a checkpoint is deferred.
  std::optional<int64_t> pending_due_;
  int64_t pending_merged_ = 0;
  int64_t last_taken_;
  // The checkpoint taken before last_taken_ (the run's first step before two were taken): it is
  // committed, since last_taken_ was taken only once every writer was done with it.
  int64_t committed_floor_;
  // The largest bound on redone steps a notice stated (0: none sent).
  int64_t noticed_bound_ = 0;
  int64_t deferred_ = 0;
  int64_t max_deferral_ = 0;
  int64_t merged_ = 0;
};

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_CHECKPOINT_SCHEDULE_H_
