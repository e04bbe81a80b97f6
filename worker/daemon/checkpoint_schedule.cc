// When a run takes its periodic checkpoints.
#include "worker/daemon/checkpoint_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zeroshard::worker {

CheckpointSchedule::CheckpointSchedule(int64_t every_steps, int64_t first_step, int64_t last_step)
    : every_steps_(every_steps),
      last_step_(last_step),
      last_taken_(first_step),
      committed_floor_(first_step) {}

bool CheckpointSchedule::Due(int64_t steps_done) const {
  return every_steps_ > 0 && steps_done % every_steps_ == 0;
}

bool CheckpointSchedule::NeedsAgreement(int64_t steps_done) const {
  if (steps_done >= last_step_) return false;
  return pending_due_.has_value() || Due(steps_done);
}

CheckpointDecision CheckpointSchedule::Decide(int64_t steps_done, bool every_writer_free) {
  CheckpointDecision decision;
  if (pending_due_.has_value()) {
    if (Due(steps_done)) ++pending_merged_;
  } else {
    pending_due_ = steps_done;
    pending_merged_ = 0;
  }
  if (!every_writer_free) return decision;
  decision.take = true;
  decision.due_step = *pending_due_;
  decision.merged = pending_merged_;
  decision.previous_step = last_taken_;
  if (steps_done > *pending_due_) {
    ++deferred_;
    max_deferral_ = std::max(max_deferral_, steps_done - *pending_due_);
    // Some writer was busy with the previous checkpoint until the step before this one: the
    // writes take about S = (this step - the previous one - 1) steps, and the bound is
    // max(every_steps, S + 1) + S (see the class comment).
    const int64_t interval = steps_done - last_taken_;
    const int64_t bound = std::max(every_steps_, interval) + interval - 1;
    if (bound > noticed_bound_ + noticed_bound_ / 2) {
      noticed_bound_ = bound;
      decision.notice = absl::StrCat(
          "checkpoint due at step ", *pending_due_, " taken at step ", steps_done,
          pending_merged_ > 0
              ? absl::StrCat(" (standing for ", pending_merged_, " later due steps too)")
              : std::string(),
          ": a rank was still writing or committing the checkpoint of step ", last_taken_,
          " until then. While a checkpoint takes about ", interval - 1,
          " steps to write and commit, a lost worker redoes up to ", bound,
          " steps (checkpoint.every_steps ", every_steps_,
          "; docs/operations.md, \"Checkpoints, resume and recovery\")");
    }
  }
  merged_ += pending_merged_;
  pending_due_.reset();
  pending_merged_ = 0;
  committed_floor_ = last_taken_;
  last_taken_ = steps_done;
  return decision;
}

int64_t CheckpointSchedule::stated_bound() const {
  if (every_steps_ <= 0) return 0;
  return std::max(noticed_bound_, 2 * every_steps_);
}

std::string CheckpointSchedule::NoteStep(int64_t steps_done) {
  if (every_steps_ <= 0) return "";
  const int64_t exposure = steps_done - committed_floor_;
  const int64_t stated = stated_bound();
  if (exposure <= stated) return "";
  // Half as large again: a slow write raises it a few times, not at every step.
  noticed_bound_ = std::max(exposure, stated + std::max<int64_t>(stated / 2, 1));
  return absl::StrCat("after step ", steps_done,
                      " the newest checkpoint certainly committed is step ", committed_floor_,
                      ": a rank is still writing or committing the checkpoint of step ",
                      last_taken_,
                      pending_due_.has_value()
                          ? absl::StrCat(" (the one due at step ", *pending_due_, " waits for it)")
                          : std::string(),
                      ". Until checkpoints are committed faster, a lost worker redoes up to ",
                      noticed_bound_, " steps (checkpoint.every_steps ", every_steps_,
                      "; docs/operations.md, \"Checkpoints, resume and recovery\")");
}

}  // namespace zeroshard::worker
