// What one engine step reports about its time (StepTimings, BucketWait) and the clock that
// gathers those figures while the buckets' reductions and the parameters' all-gathers run.
#ifndef ZEROSHARD_WORKER_ENGINE_STEP_TIMINGS_H_
#define ZEROSHARD_WORKER_ENGINE_STEP_TIMINGS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace zeroshard::engine {

// How long the host was blocked on one bucket's reduction in one step, milliseconds (the
// bucket's share of StepTimings::exposed_comm_ms).
struct BucketWait {
  // While gradients were being handed over: GradBuffer() or the bucket launch waiting for this
  // bucket's reduction to free its pool buffer (every buffer of the pool in flight).
  double backward_ms = 0.0;
  // In Step(): waiting for this bucket's reduction to finish.
  double step_ms = 0.0;
};

// Milliseconds spent in the parts of one step.
struct StepTimings {
  // Gradient reduction: the sum of the buckets' reductions' run times on the communicator
  // (comm::Work::RunTime: from when each started executing until it finished). With a backend
  // that does not record run times, the wall time from the first bucket's launch until the last
  // bucket was seen complete (an upper bound).
  double comm_ms = 0.0;
  // The part of comm_ms hidden behind backward: comm_ms - exposed_comm_ms (at least 0).
  double overlapped_comm_ms = 0.0;
  // Time the host was blocked waiting for bucket reductions: in Step(), plus in GradBuffer() when
  // every bucket buffer of the pool was in flight and the communicator waits on the host (with
  // a device communicator the compute stream waits instead, Work::WaitOnComputeStream).
  double exposed_comm_ms = 0.0;
  // exposed_comm_ms bucket by bucket (bucket_waits[b] for bucket b of the plan). The engine
  // allocated the storage when it was created (a step allocates nothing); it holds this step's
  // figures until the next Step() begins.
  absl::Span<const BucketWait> bucket_waits;
  // Combining the gradient statistics and their small all-reduce {sum of squares, non-finite,
  // loss}. The passes over the gradients are not in it: each bucket's statistics are summed on
  // the move of its reduced values (or, reduced in place, right after its reduction) when it
  // retires, during backward or, for the buckets still in flight, at the start of Step().
  double grad_stats_ms = 0.0;
  double update_ms = 0.0;
  // Issuing this step's parameter all-gathers (0 in ddp and on skipped steps). Step() does not
  // wait for them: the next iteration's Parameters() calls do (param_wait_ms), and the next
  // step reports how long they ran (allgather_run_ms).
  double allgather_ms = 0.0;
  // The all-gathers the previous Step() issued, whose parameters this iteration read: the sum of
  // their run times on the communicator (they run back to back, so this is also their wall time
  // there), or, with a backend that does not record run times, the wall time from their issue
  // until the owner saw the last one complete. 0 when the previous step issued none (ddp, the
  // first step, after a skipped step).
  double allgather_run_ms = 0.0;
  // Time the owner was blocked on those all-gathers since the previous Step() returned: in
  // Parameters() (forward waiting for the buckets of the tensor it reads next) and at the start
  // of this Step() (all-gathers no Parameters() call waited for). The part of allgather_run_ms
  // that forward did not hide. With a device communicator Parameters() makes the compute stream
  // wait instead of the host, so this is about 0 there.
  double param_wait_ms = 0.0;
  // The whole of Step().
  double step_ms = 0.0;
  // Wall clock, for comparing with a plain all-reduce of the same bytes: from the first bucket's
  // launch (during backward) until Step() saw the last reduction complete.
  double reduce_wall_ms = 0.0;
};

// Collects the communication figures of StepTimings as they happen: the reductions' launches,
// host waits and run times (from the first gradient of a step to its Step()), and the
// all-gathers' issue, waits and run times (from one Step() to the next). Allocates only when
// made: the per-bucket waits live in two sets of num_buckets, this step's and the previous
// step's, which the last StepTimings::bucket_waits points to until the next step begins.
//
// Thread contract: not thread-safe; the engine's owner thread calls everything.
class StepTimer {
 public:
  explicit StepTimer(int64_t num_buckets);

  // ---- Reductions (the current step) ----
  // A bucket's reduction was launched (the first one starts the reduction's wall clock).
  void ReductionLaunched();
  // The host waited `waited` on `bucket`'s reduction: in backward, or in Step() once
  // StartReductionWaitsInStep() was called.
  void ReductionWaited(int64_t bucket, absl::Duration waited);
  // The host saw a reduction complete at `seen`; `run_time` is its Work::RunTime.
  void ReductionFinished(absl::Time seen, std::optional<absl::Duration> run_time);
  // From now until EndStep(), host waits on reductions count as the step's, not backward's.
  void StartReductionWaitsInStep() { in_step_ = true; }
  // Fills comm_ms, overlapped_comm_ms, exposed_comm_ms, bucket_waits and reduce_wall_ms.
  // REQUIRES: every reduction of the step finished.
  void ReductionTimings(StepTimings& timings) const;
  // The step is over: the next one's reductions start from zero, into the other wait set.
  void EndStep();

  // ---- All-gathers (issued by one Step(), awaited until the next) ----
  void GathersIssued() { gathers_issued_ = absl::Now(); }
  // The owner saw an all-gather complete now; `run_time` is its Work::RunTime.
  void GatherFinished(std::optional<absl::Duration> run_time);
  // The owner was blocked `waited` on all-gathers.
  void GatherWaited(absl::Duration waited) { param_wait_ += waited; }
  // Fills allgather_run_ms and param_wait_ms with the all-gathers since the last call, and
  // starts counting anew. REQUIRES: every all-gather issued was finished.
  void TakeGatherTimings(StepTimings& timings);

 private:
  // Reductions. first_launch_ is InfiniteFuture and last_reduced_ InfinitePast until set.
  absl::Time first_launch_ = absl::InfiniteFuture();
  absl::Time last_reduced_ = absl::InfinitePast();
  absl::Duration exposed_wait_ = absl::ZeroDuration();
  bool in_step_ = false;
  std::array<std::vector<BucketWait>, 2> bucket_waits_;
  int current_bucket_waits_ = 0;
  // Sum of the finished reductions' run times; false once one came without a run time.
  absl::Duration reduce_run_time_ = absl::ZeroDuration();
  bool run_times_recorded_ = true;

  // All-gathers: when they were issued (InfinitePast: none since the last TakeGatherTimings),
  // when the owner last saw one complete, the sum of the finished ones' run times (false once
  // one came without a run time), and how long the owner has been blocked on them.
  absl::Time gathers_issued_ = absl::InfinitePast();
  absl::Time last_gathered_ = absl::InfinitePast();
  absl::Duration gather_run_time_ = absl::ZeroDuration();
  bool gather_run_times_recorded_ = true;
  absl::Duration param_wait_ = absl::ZeroDuration();
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_STEP_TIMINGS_H_
