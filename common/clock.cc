// Real and fake clocks.
#include "common/clock.h"

namespace zeroshard::common {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline);
  }
};

// How often a fake-clock waiter re-reads the fake time: it cannot be signalled through the
// caller's mutex, so it polls at this real-time granularity.
constexpr absl::Duration kFakeClockPoll = absl::Milliseconds(1);

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) {
  while (true) {
    if (mu->AwaitWithTimeout(cond, kFakeClockPoll)) return true;
    if (Now() >= deadline) return cond.Eval();
  }
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

void FakeClock::SetTime(absl::Time t) {
  absl::MutexLock lock(&mu_);
  now_ = t;
}

}  // namespace zeroshard::common
