// Renders a job's event stream for people: a live progress bar on a terminal (step/steps, loss,
// iteration time, ETA, peak RSS), or one plain line per event otherwise. Jobs without a fixed
// step count (attached jobs, spec.steps 0) get the step alone: no bar, no ETA.
#ifndef ZEROSHARD_CLIENT_PROGRESS_VIEW_H_
#define ZEROSHARD_CLIENT_PROGRESS_VIEW_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/shard_plan.pb.h"

namespace zeroshard::client {

// Not thread-safe: feed it events from one thread.
class ProgressView {
 public:
  ProgressView(std::string job_id, int64_t total_steps, bool terminal, std::ostream* out);

  void OnEvent(const v1::JobEvent& event);
  // Ends the bar's line.
  void Close();

  v1::JobState final_state() const { return state_; }

  // "[#####-----]  40/80  loss 0.0123  2.10 ms/iter  ETA 0:00:02  peak RSS 512.0 MiB" for a
  // progress event: the whole iteration's time (forward, backward and step) and the worker's
  // peak RSS where the worker reports them; "ms/step" (the engine's step alone) and no RSS for
  // workers that do not. Without a fixed step count (`total_steps` <= 0): "step 40  loss 0.0123
  // 2.10 ms/iter  peak RSS 512.0 MiB".
  static std::string ProgressLine(const v1::StepMetrics& metrics, int64_t total_steps,
                                  int bar_width);

 private:
  std::string job_id_;
  int64_t total_steps_;
  bool terminal_;
  std::ostream* out_;
  bool bar_open_ = false;
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;
};

// "40/80", or "40" for a job without a fixed step count (`total_steps` <= 0).
std::string StepOfTotal(int64_t step, int64_t total_steps);

// The shard map of a running generation, one view per rank (rank 0's with the global layout):
// buckets, each rank's pieces, and bytes per rank.
void PrintShardMap(const std::vector<v1::ShardPlan>& ranks, std::ostream* out);

}  // namespace zeroshard::client

#endif  // ZEROSHARD_CLIENT_PROGRESS_VIEW_H_
