// One generation's training on this worker, as the daemon sees it: started from an assignment,
// runs on its own thread, can be aborted, reports its step.
#ifndef ZEROSHARD_WORKER_DAEMON_TRAINING_RUN_H_
#define ZEROSHARD_WORKER_DAEMON_TRAINING_RUN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "zeroshard/v1/worker.pb.h"

namespace zeroshard::worker {

// Thread-safe: the daemon's thread calls these while the run's own thread trains.
class TrainingRun {
 public:
  // Joins the run's thread (after aborting it if it still runs).
  virtual ~TrainingRun() = default;
  // Stops the run promptly: pending collectives fail, the current step is abandoned.
  virtual void Abort() = 0;
  // Whether the run's thread has ended (finished, failed or aborted).
  virtual bool Done() const = 0;
  // How it ended; OK while running.
  virtual absl::Status status() const = 0;
  // Steps completed.
  virtual int64_t step() const = 0;
  // Once Done() and failed: the ranks of its generation it saw die (their processes ended), in
  // the order seen, for the coordinator, which then does not wait for their workers. Empty
  // otherwise, and when it cannot tell.
  virtual std::vector<int32_t> lost_peer_ranks() const = 0;
};

// Starts the run for a RUN assignment.
using TrainingRunFactory =
    std::function<std::unique_ptr<TrainingRun>(const v1::Assignment& assignment)>;

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_TRAINING_RUN_H_
