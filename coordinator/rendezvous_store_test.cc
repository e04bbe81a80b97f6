// Tests for the rendezvous store: waiting Gets, counters, limits, generations, cancellation races,
// shutdown, and that waiters cost no threads. Time is a FakeClock; nothing sleeps.
#include "coordinator/rendezvous_store.h"

#include <dirent.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kRealTimeLimit = absl::Seconds(10);
const char kJob[] = "job-a";

// Records the outcomes one Get delivers; counts calls so tests can check exactly-once.
class GetRecorder {
 public:
  RendezvousStore::GetCallback Callback() {
    return [this](absl::StatusOr<std::string> result) {
      {
        absl::MutexLock lock(&mu_);
        result_ = std::move(result);
      }
      if (calls_.fetch_add(1) == 0) first_call_.Notify();
    };
  }
  int calls() const { return calls_.load(); }
  bool WaitForCall() { return first_call_.WaitForNotificationWithTimeout(kRealTimeLimit); }
  absl::StatusOr<std::string> result() const {
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  std::atomic<int> calls_{0};
  absl::Notification first_call_;
  mutable absl::Mutex mu_;
  absl::StatusOr<std::string> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not called");
};

int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

class RendezvousStoreTest : public ::testing::Test {
 protected:
  RendezvousStoreTest() : store_(std::make_unique<RendezvousStore>(&clock_)) {
    store_->OpenNamespace(kJob, 1);
  }

  common::FakeClock clock_;
  std::unique_ptr<RendezvousStore> store_;
};

TEST_F(RendezvousStoreTest, SetThenGetDeliversValueInline) {
  ASSERT_TRUE(store_->Set(kJob, 1, "addr", "10.0.0.1:1234").ok());
  GetRecorder recorder;
  EXPECT_EQ(store_->Get(kJob, 1, "addr", absl::Seconds(5), recorder.Callback()), 0u);
  EXPECT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().value(), "10.0.0.1:1234");
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, ZeroTimeoutOnMissingKeyIsNotFound) {
  GetRecorder recorder;
  EXPECT_EQ(store_->Get(kJob, 1, "addr", absl::ZeroDuration(), recorder.Callback()), 0u);
  ASSERT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(recorder.result().status().message(), "key: 'addr' is not set");
}

TEST_F(RendezvousStoreTest, GetWaitsUntilSet) {
  GetRecorder recorder;
  EXPECT_NE(store_->Get(kJob, 1, "addr", absl::Seconds(30), recorder.Callback()), 0u);
  EXPECT_EQ(recorder.calls(), 0);
  EXPECT_EQ(store_->PendingWaiters(), 1);
  ASSERT_TRUE(store_->Set(kJob, 1, "other", "x").ok());
  EXPECT_EQ(recorder.calls(), 0);
  ASSERT_TRUE(store_->Set(kJob, 1, "addr", "host:1").ok());
  EXPECT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().value(), "host:1");
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, SetWakesEveryWaiterOfTheKey) {
  constexpr int kWaiters = 200;
  std::vector<GetRecorder> recorders(kWaiters);
  for (GetRecorder& recorder : recorders) {
    store_->Get(kJob, 1, "barrier", absl::Minutes(1), recorder.Callback());
  }
  EXPECT_EQ(store_->PendingWaiters(), kWaiters);
  ASSERT_TRUE(store_->Set(kJob, 1, "barrier", "open").ok());
  for (const GetRecorder& recorder : recorders) {
    EXPECT_EQ(recorder.calls(), 1);
    EXPECT_EQ(recorder.result().value(), "open");
  }
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, GetTimesOutOnlyOnceFakeTimeReachesTheDeadline) {
  GetRecorder recorder;
  store_->Get(kJob, 1, "addr", absl::Seconds(10), recorder.Callback());
  clock_.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  store_->ExpireDueWaiters();
  EXPECT_EQ(recorder.calls(), 0);
  EXPECT_EQ(store_->PendingWaiters(), 1);

  clock_.Advance(absl::Milliseconds(1));
  store_->ExpireDueWaiters();
  ASSERT_TRUE(recorder.WaitForCall());
  EXPECT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(recorder.result().status().message(), HasSubstr("timeout_ms"));
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, TimerThreadExpiresWaitersOnItsOwn) {
  GetRecorder late;
  GetRecorder early;
  store_->Get(kJob, 1, "late", absl::Minutes(5), late.Callback());
  store_->Get(kJob, 1, "early", absl::Seconds(1), early.Callback());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(early.WaitForCall());
  EXPECT_EQ(early.result().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.calls(), 0);
  clock_.Advance(absl::Minutes(5));
  ASSERT_TRUE(late.WaitForCall());
  EXPECT_EQ(late.result().status().code(), absl::StatusCode::kDeadlineExceeded);
}

// On the real clock the timer thread sleeps until the earliest deadline; a new, earlier deadline
// must wake it. Without that wake-up the 10 ms waiter would wait out the 10 min one.
TEST(RendezvousStoreRealClockTest, EarlierDeadlineWakesTheTimer) {
  GetRecorder late;
  GetRecorder early;
  RendezvousStore store(common::Clock::Real());
  store.OpenNamespace(kJob, 1);
  store.Get(kJob, 1, "late", absl::Minutes(10), late.Callback());
  store.Get(kJob, 1, "early", absl::Milliseconds(10), early.Callback());
  ASSERT_TRUE(early.WaitForCall());
  EXPECT_EQ(early.result().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.calls(), 0);
}

TEST_F(RendezvousStoreTest, NamespaceErrorsNameTheField) {
  store_->OpenNamespace(kJob, 4);
  struct Case {
    std::string job_id;
    int64_t generation;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"job-x", 4, absl::StatusCode::kNotFound, "job_id: no rendezvous namespace for job 'job-x'"},
      {kJob, 3, absl::StatusCode::kFailedPrecondition, "generation: 3 is stale (current is 4)"},
      {kJob, 5, absl::StatusCode::kFailedPrecondition,
       "generation: 5 has not started (current is 4)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.job_id, "/", c.generation));
    absl::Status set = store_->Set(c.job_id, c.generation, "k", "v");
    EXPECT_EQ(set.code(), c.code);
    EXPECT_EQ(set.message(), c.message);
    EXPECT_EQ(store_->Add(c.job_id, c.generation, "k", 1).status().message(), c.message);
    EXPECT_EQ(store_->Delete(c.job_id, c.generation, "k").status().message(), c.message);
    GetRecorder recorder;
    EXPECT_EQ(store_->Get(c.job_id, c.generation, "k", absl::Seconds(1), recorder.Callback()), 0u);
    EXPECT_EQ(recorder.result().status().code(), c.code);
    EXPECT_EQ(recorder.result().status().message(), c.message);
  }
  store_->DropNamespace(kJob, 4);
  absl::Status ended = store_->Set(kJob, 4, "k", "v");
  EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ended.message(), "generation: 4 of job 'job-a' has ended");
}

TEST_F(RendezvousStoreTest, ArgumentErrorsNameTheField) {
  RendezvousLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_keys_per_namespace = 2;
  limits.max_wait = absl::Seconds(60);
  RendezvousStore store(&clock_, limits);
  store.OpenNamespace(kJob, 1);

  absl::Status empty_key = store.Set(kJob, 1, "", "v");
  EXPECT_EQ(empty_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty_key.message(), "key: must not be empty");
  absl::Status long_key = store.Set(kJob, 1, "123456789", "v");
  EXPECT_EQ(long_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(long_key.message(), "key: 9 bytes exceeds the maximum of 8 bytes");
  EXPECT_TRUE(store.Set(kJob, 1, "12345678", "v").ok());
  absl::Status big_value = store.Set(kJob, 1, "k", std::string(17, 'x'));
  EXPECT_EQ(big_value.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big_value.message(), "value: 17 bytes exceeds the maximum of 16 bytes");
  EXPECT_TRUE(store.Set(kJob, 1, "k", std::string(16, 'x')).ok());

  absl::Status full = store.Set(kJob, 1, "third", "v");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "key: namespace holds the maximum of 2 keys");
  EXPECT_EQ(store.Add(kJob, 1, "third", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.Set(kJob, 1, "k", "overwritten").ok());
  EXPECT_TRUE(store.Delete(kJob, 1, "k").value());
  EXPECT_TRUE(store.Set(kJob, 1, "third", "fits again").ok());

  EXPECT_EQ(store.Add(kJob, 1, "", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Delete(kJob, 1, "123456789").status().code(), absl::StatusCode::kInvalidArgument);

  GetRecorder negative;
  EXPECT_EQ(store.Get(kJob, 1, "k", absl::Milliseconds(-5), negative.Callback()), 0u);
  EXPECT_EQ(negative.result().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.result().status().message(), "timeout_ms: must not be negative, got -5");
  GetRecorder too_long;
  EXPECT_EQ(store.Get(kJob, 1, "k", absl::Seconds(61), too_long.Callback()), 0u);
  EXPECT_EQ(too_long.result().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.result().status().message(), "timeout_ms: 61000 exceeds the maximum of 60000");
  GetRecorder bad_key;
  EXPECT_EQ(store.Get(kJob, 1, "", absl::Seconds(1), bad_key.Callback()), 0u);
  EXPECT_EQ(bad_key.result().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, OpeningANewerGenerationFailsOlderWaitersAndDropsOlderKeys) {
  ASSERT_TRUE(store_->Set(kJob, 1, "kept?", "no").ok());
  GetRecorder recorder;
  store_->Get(kJob, 1, "addr", absl::Minutes(1), recorder.Callback());
  store_->OpenNamespace(kJob, 2);
  ASSERT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(recorder.result().status().message(), "generation: 1 is stale (current is 2)");
  EXPECT_EQ(store_->PendingWaiters(), 0);

  GetRecorder fresh;
  store_->Get(kJob, 2, "kept?", absl::ZeroDuration(), fresh.Callback());
  EXPECT_EQ(fresh.result().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RendezvousStoreTest, OpeningAnOlderOrTheSameGenerationChangesNothing) {
  store_->OpenNamespace(kJob, 3);
  ASSERT_TRUE(store_->Set(kJob, 3, "k", "v").ok());
  store_->OpenNamespace(kJob, 3);
  store_->OpenNamespace(kJob, 2);
  GetRecorder recorder;
  store_->Get(kJob, 3, "k", absl::ZeroDuration(), recorder.Callback());
  EXPECT_EQ(recorder.result().value(), "v");

  store_->DropNamespace(kJob, 3);
  store_->OpenNamespace(kJob, 3);
  EXPECT_EQ(store_->Set(kJob, 3, "k", "v").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RendezvousStoreTest, DropNamespaceFailsWaitersAndDropJobForgetsTheJob) {
  GetRecorder recorder;
  store_->Get(kJob, 1, "addr", absl::Minutes(1), recorder.Callback());
  store_->DropNamespace(kJob, 0);
  EXPECT_EQ(recorder.calls(), 0);
  store_->DropNamespace(kJob, 1);
  ASSERT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(recorder.result().status().message(), "generation: 1 of job 'job-a' has ended");

  store_->OpenNamespace(kJob, 2);
  GetRecorder dropped_with_job;
  store_->Get(kJob, 2, "addr", absl::Minutes(1), dropped_with_job.Callback());
  store_->DropJob(kJob);
  ASSERT_EQ(dropped_with_job.calls(), 1);
  EXPECT_EQ(dropped_with_job.result().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(dropped_with_job.result().status().message(), "job_id: job 'job-a' has ended");
  EXPECT_EQ(store_->KnownJobs(), 0);
  EXPECT_EQ(store_->Set(kJob, 2, "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, ManyGenerationsKeepOneNamespacePerJob) {
  constexpr int64_t kLastGeneration = 2000;
  std::atomic<int> stale{0};
  std::atomic<int> cancelled{0};
  for (int64_t generation = 2; generation <= kLastGeneration; ++generation) {
    store_->OpenNamespace(kJob, generation);
    for (int key = 0; key < 8; ++key) {
      ASSERT_TRUE(store_->Set(kJob, generation, absl::StrCat("rank/", key), "addr").ok());
    }
    store_->Get(kJob, generation, "never", absl::Minutes(1),
                [&](absl::StatusOr<std::string> result) {
                  if (result.status().code() == absl::StatusCode::kFailedPrecondition) ++stale;
                  if (result.status().code() == absl::StatusCode::kCancelled) ++cancelled;
                });
  }
  EXPECT_EQ(store_->KnownJobs(), 1);
  EXPECT_EQ(store_->PendingWaiters(), 1);
  EXPECT_EQ(stale.load(), kLastGeneration - 2);
  store_.reset();
  EXPECT_EQ(cancelled.load(), 1);
}

TEST_F(RendezvousStoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        ASSERT_TRUE(store_->Add(kJob, 1, "arrived", 1).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(store_->Add(kJob, 1, "arrived", 0).value(), kThreads * kAddsPerThread);
  GetRecorder recorder;
  store_->Get(kJob, 1, "arrived", absl::ZeroDuration(), recorder.Callback());
  EXPECT_EQ(recorder.result().value(), absl::StrCat(kThreads * kAddsPerThread));
}

TEST_F(RendezvousStoreTest, AddCountsFromZeroWakesWaitersAndRejectsNonIntegers) {
  GetRecorder recorder;
  store_->Get(kJob, 1, "count", absl::Minutes(1), recorder.Callback());
  EXPECT_EQ(store_->Add(kJob, 1, "count", -3).value(), -3);
  EXPECT_EQ(recorder.result().value(), "-3");
  EXPECT_EQ(store_->Add(kJob, 1, "count", 10).value(), 7);

  ASSERT_TRUE(store_->Set(kJob, 1, "text", "seven").ok());
  absl::Status not_integer = store_->Add(kJob, 1, "text", 1).status();
  EXPECT_EQ(not_integer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(not_integer.message(), "key: 'text' holds a value that is not a decimal integer");

  ASSERT_TRUE(store_->Set(kJob, 1, "big", absl::StrCat(INT64_MAX)).ok());
  EXPECT_EQ(store_->Add(kJob, 1, "big", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(RendezvousStoreTest, DeleteRemovesTheKeyAndLeavesWaitersWaiting) {
  ASSERT_TRUE(store_->Set(kJob, 1, "k", "v").ok());
  EXPECT_TRUE(store_->Delete(kJob, 1, "k").value());
  EXPECT_FALSE(store_->Delete(kJob, 1, "k").value());
  GetRecorder recorder;
  store_->Get(kJob, 1, "k", absl::Minutes(1), recorder.Callback());
  EXPECT_EQ(recorder.calls(), 0);
  ASSERT_TRUE(store_->Set(kJob, 1, "k", "again").ok());
  EXPECT_EQ(recorder.result().value(), "again");
}

TEST_F(RendezvousStoreTest, CancelWaitCompletesOnceWithCancelled) {
  GetRecorder recorder;
  RendezvousStore::WaiterId id = store_->Get(kJob, 1, "k", absl::Minutes(1), recorder.Callback());
  ASSERT_NE(id, 0u);
  EXPECT_TRUE(store_->CancelWait(id));
  EXPECT_EQ(recorder.calls(), 1);
  EXPECT_EQ(recorder.result().status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(store_->CancelWait(id));
  EXPECT_FALSE(store_->CancelWait(0));
  ASSERT_TRUE(store_->Set(kJob, 1, "k", "v").ok());
  clock_.Advance(absl::Minutes(2));
  store_->ExpireDueWaiters();
  EXPECT_EQ(recorder.calls(), 1);
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

// Cancellation, Set, expiry and a namespace drop race over the same waiters: each callback runs
// exactly once, and each successful CancelWait matches one CANCELLED outcome.
TEST_F(RendezvousStoreTest, CompletionRacesDeliverExactlyOnce) {
  constexpr int kWaiters = 2000;
  constexpr int kCancellers = 4;
  std::vector<GetRecorder> recorders(kWaiters);
  std::vector<RendezvousStore::WaiterId> ids(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    ids[i] = store_->Get(kJob, 1, absl::StrCat("k", i % 3), absl::Seconds(1 + i % 2),
                         recorders[i].Callback());
    ASSERT_NE(ids[i], 0u);
  }
  std::atomic<int> successful_cancels{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kCancellers; ++c) {
    threads.emplace_back([&, c] {
      for (int i = c; i < kWaiters; i += 2) {
        if (store_->CancelWait(ids[i])) successful_cancels.fetch_add(1);
      }
    });
  }
  threads.emplace_back([this] {
    // Lands before the drop (OK) or after it (the generation has ended).
    absl::Status set = store_->Set(kJob, 1, "k0", "v");
    EXPECT_TRUE(set.ok() || set.code() == absl::StatusCode::kFailedPrecondition) << set;
  });
  threads.emplace_back([this] {
    clock_.Advance(absl::Seconds(1));
    store_->ExpireDueWaiters();
  });
  threads.emplace_back([this] { store_->DropNamespace(kJob, 1); });
  for (std::thread& thread : threads) thread.join();

  int cancelled = 0;
  for (GetRecorder& recorder : recorders) {
    ASSERT_TRUE(recorder.WaitForCall());
    EXPECT_EQ(recorder.calls(), 1);
    if (recorder.result().status().code() == absl::StatusCode::kCancelled) ++cancelled;
  }
  EXPECT_EQ(cancelled, successful_cancels.load());
  EXPECT_EQ(store_->PendingWaiters(), 0);
}

TEST_F(RendezvousStoreTest, CallbacksMayCallBackIntoTheStore) {
  GetRecorder chained;
  store_->Get(kJob, 1, "first", absl::Minutes(1), [this](absl::StatusOr<std::string> value) {
    ASSERT_TRUE(value.ok());
    ASSERT_TRUE(store_->Set(kJob, 1, "second", *value + "!").ok());
  });
  store_->Get(kJob, 1, "second", absl::Minutes(1), chained.Callback());
  ASSERT_TRUE(store_->Set(kJob, 1, "first", "hello").ok());
  EXPECT_EQ(chained.result().value(), "hello!");
}

TEST_F(RendezvousStoreTest, DestructionCancelsPendingWaiters) {
  constexpr int kWaiters = 50;
  std::vector<GetRecorder> recorders(kWaiters);
  for (GetRecorder& recorder : recorders) {
    store_->Get(kJob, 1, "never", absl::Minutes(1), recorder.Callback());
  }
  store_.reset();
  for (const GetRecorder& recorder : recorders) {
    EXPECT_EQ(recorder.calls(), 1);
    EXPECT_EQ(recorder.result().status().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(recorder.result().status().message(), "coordinator shutting down");
  }
}

TEST_F(RendezvousStoreTest, ThousandWaitersCreateNoThreads) {
  constexpr int kWaiters = 1000;
  const int threads_before = ThreadCount();
  ASSERT_GT(threads_before, 0);
  std::vector<GetRecorder> recorders(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    store_->Get(kJob, 1, absl::StrCat("rank/", i % 10), absl::Minutes(5), recorders[i].Callback());
  }
  EXPECT_EQ(store_->PendingWaiters(), kWaiters);
  EXPECT_EQ(ThreadCount(), threads_before);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(store_->Set(kJob, 1, absl::StrCat("rank/", i), "ready").ok());
  }
  for (const GetRecorder& recorder : recorders) EXPECT_EQ(recorder.calls(), 1);
  EXPECT_EQ(ThreadCount(), threads_before);
}

}  // namespace
}  // namespace zeroshard::coordinator
