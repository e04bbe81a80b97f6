// AbortSignal: callbacks run once, at Abort or at registration when already aborted, never after
// their Registration is gone; a Registration's destructor waits for its running callback.
#include "worker/comm/abort_signal.h"

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace zeroshard::comm {
namespace {

TEST(AbortSignalTest, AbortRunsEachRegisteredCallbackOnce) {
  AbortSignal signal;
  int first = 0;
  int second = 0;
  AbortSignal::Registration a = signal.OnAbort([&] { ++first; });
  AbortSignal::Registration b = signal.OnAbort([&] { ++second; });
  EXPECT_FALSE(signal.aborted());
  EXPECT_EQ(first + second, 0);
  signal.Abort();
  EXPECT_TRUE(signal.aborted());
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
  signal.Abort();
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
}

TEST(AbortSignalTest, RegisteringAfterAbortRunsTheCallbackAtOnce) {
  AbortSignal signal;
  signal.Abort();
  int calls = 0;
  {
    AbortSignal::Registration registration = signal.OnAbort([&] { ++calls; });
    EXPECT_EQ(calls, 1);
  }
  signal.Abort();
  EXPECT_EQ(calls, 1);
}

TEST(AbortSignalTest, AGoneRegistrationIsNotCalled) {
  AbortSignal signal;
  int gone = 0;
  int kept = 0;
  std::optional<AbortSignal::Registration> moved;
  {
    AbortSignal::Registration temporary = signal.OnAbort([&] { ++gone; });
    AbortSignal::Registration original = signal.OnAbort([&] { ++kept; });
    moved.emplace(std::move(original));
  }
  signal.Abort();
  EXPECT_EQ(gone, 0);
  EXPECT_EQ(kept, 1);
}

TEST(AbortSignalTest, DestroyingARegistrationWaitsForItsRunningCallback) {
  AbortSignal signal;
  absl::Notification callback_started;
  absl::Notification release_callback;
  std::atomic<bool> callback_returned{false};
  auto registration = std::make_unique<AbortSignal::Registration>(signal.OnAbort([&] {
    callback_started.Notify();
    release_callback.WaitForNotification();
    callback_returned.store(true);
  }));
  std::thread aborter([&] { signal.Abort(); });
  ASSERT_TRUE(callback_started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Notification destroyed;
  std::thread owner([&] {
    registration.reset();
    EXPECT_TRUE(callback_returned.load());
    destroyed.Notify();
  });
  // The owner stays blocked while the callback runs...
  EXPECT_FALSE(destroyed.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  release_callback.Notify();
  // ...and returns once it has.
  EXPECT_TRUE(destroyed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  aborter.join();
  owner.join();
}

}  // namespace
}  // namespace zeroshard::comm
