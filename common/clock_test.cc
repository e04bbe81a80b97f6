// Tests for the fake clock: time moves only by hand and deadline waits follow it.
#include "common/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1003));
  clock.SetTime(absl::FromUnixSeconds(7));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(7));
}

TEST(FakeClockTest, AwaitReturnsTrueWhenConditionHolds) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = true;
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now()));
}

TEST(FakeClockTest, AwaitTimesOutOnlyWhenFakeTimePassesDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  const absl::Time deadline = clock.Now() + absl::Seconds(10);
  std::thread advancer([&] { clock.Advance(absl::Seconds(10)); });
  bool result;
  {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), deadline);
  }
  advancer.join();
  EXPECT_FALSE(result);
  EXPECT_GE(clock.Now(), deadline);
}

TEST(FakeClockTest, AwaitWakesWhenConditionBecomesTrue) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    absl::MutexLock lock(&mu);
    ready = true;
  });
  bool result;
  {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now() + absl::Hours(1));
  }
  setter.join();
  EXPECT_TRUE(result);
}

TEST(RealClockTest, IsMonotonicEnough) {
  const absl::Time a = Clock::Real()->Now();
  const absl::Time b = Clock::Real()->Now();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace zeroshard::common
