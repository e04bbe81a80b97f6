// The engine's step clock (step_timings.h).
#include "worker/engine/step_timings.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace zeroshard::engine {
namespace {

double Milliseconds(absl::Duration duration) { return absl::ToDoubleMilliseconds(duration); }

}  // namespace

StepTimer::StepTimer(int64_t num_buckets)
    : bucket_waits_{std::vector<BucketWait>(num_buckets), std::vector<BucketWait>(num_buckets)} {}

void StepTimer::ReductionLaunched() {
  if (first_launch_ == absl::InfiniteFuture()) first_launch_ = absl::Now();
}

void StepTimer::ReductionWaited(int64_t bucket, absl::Duration waited) {
  exposed_wait_ += waited;
  BucketWait& share = bucket_waits_[current_bucket_waits_][bucket];
  (in_step_ ? share.step_ms : share.backward_ms) += Milliseconds(waited);
}

void StepTimer::ReductionFinished(absl::Time seen, std::optional<absl::Duration> run_time) {
  last_reduced_ = seen;
  if (run_time.has_value()) {
    reduce_run_time_ += *run_time;
  } else {
    run_times_recorded_ = false;
  }
}

void StepTimer::ReductionTimings(StepTimings& timings) const {
  timings.exposed_comm_ms = Milliseconds(exposed_wait_);
  timings.bucket_waits = bucket_waits_[current_bucket_waits_];
  timings.comm_ms =
      Milliseconds(run_times_recorded_ ? reduce_run_time_ : last_reduced_ - first_launch_);
  timings.overlapped_comm_ms = std::max(0.0, timings.comm_ms - timings.exposed_comm_ms);
  timings.reduce_wall_ms = Milliseconds(last_reduced_ - first_launch_);
}

void StepTimer::EndStep() {
  first_launch_ = absl::InfiniteFuture();
  last_reduced_ = absl::InfinitePast();
  exposed_wait_ = absl::ZeroDuration();
  in_step_ = false;
  // The result just returned points to the current set: the next step records into the other.
  current_bucket_waits_ = 1 - current_bucket_waits_;
  std::fill(bucket_waits_[current_bucket_waits_].begin(),
            bucket_waits_[current_bucket_waits_].end(), BucketWait{});
  reduce_run_time_ = absl::ZeroDuration();
  run_times_recorded_ = true;
}

void StepTimer::GatherFinished(std::optional<absl::Duration> run_time) {
  last_gathered_ = absl::Now();
  if (run_time.has_value()) {
    gather_run_time_ += *run_time;
  } else {
    gather_run_times_recorded_ = false;
  }
}

void StepTimer::TakeGatherTimings(StepTimings& timings) {
  if (gathers_issued_ != absl::InfinitePast()) {
    timings.allgather_run_ms = Milliseconds(
        gather_run_times_recorded_ ? gather_run_time_ : last_gathered_ - gathers_issued_);
  }
  timings.param_wait_ms = Milliseconds(param_wait_);
  gathers_issued_ = absl::InfinitePast();
  gather_run_time_ = absl::ZeroDuration();
  gather_run_times_recorded_ = true;
  param_wait_ = absl::ZeroDuration();
}

}  // namespace zeroshard::engine
