// Clock abstraction: a real monotonic clock and a fake clock that tests advance by hand.
#ifndef ZEROSHARD_COMMON_CLOCK_H_
#define ZEROSHARD_COMMON_CLOCK_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zeroshard::common {

// Thread-safe. Components take a Clock* instead of calling absl::Now(), so unit tests
// control time and never sleep.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks until Now() >= deadline, or until `cond` holds (checked under `mu`, which the
  // caller holds). Returns whether `cond` became true.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // The process-wide real clock.
  static Clock* Real();
};

// A clock that only moves when Advance() or SetTime() is called. Thread-safe: waiters
// blocked in AwaitWithDeadline wake when their deadline is reached by an Advance().
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 56));

  absl::Time Now() const override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Advance(absl::Duration d);
  void SetTime(absl::Time t);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::common

#endif  // ZEROSHARD_COMMON_CLOCK_H_
