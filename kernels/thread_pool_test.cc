// Tests of the kernels' thread pool: every task runs exactly once, on several threads.
#include "kernels/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/dcheck.h"
#include "gtest/gtest.h"

namespace zeroshard::kernels {
namespace {

class ThreadPoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolTest, RunsEveryTaskOnce) {
  ThreadPool pool(GetParam());
  EXPECT_EQ(pool.num_threads(), GetParam());
  for (int64_t num_tasks : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> runs(num_tasks);
    pool.ParallelFor(num_tasks, [&](int64_t i) { runs[i].fetch_add(1); });
    for (int64_t i = 0; i < num_tasks; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
  }
}

TEST_P(ThreadPoolTest, ReusableAcrossManyCalls) {
  ThreadPool pool(GetParam());
  int64_t total = 0;
  for (int call = 0; call < 200; ++call) {
    std::vector<int64_t> out(17, 0);
    pool.ParallelFor(17, [&](int64_t i) { out[i] = i * call; });
    for (int64_t v : out) total += v;
  }
  EXPECT_EQ(total, 136 * (199 * 200 / 2));
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadPoolTest, ::testing::Values(1, 2, 3, 8));

TEST(ThreadPoolTest, UsesMoreThanOneThreadWhenTasksWait) {
  ThreadPool pool(2);
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  int arrived = 0;
  // Both tasks wait until both have started, which only two threads can achieve.
  pool.ParallelFor(2, [&](int64_t) {
    absl::MutexLock lock(&mu);
    threads.insert(std::this_thread::get_id());
    ++arrived;
    mu.Await(absl::Condition(
        +[](int* n) { return *n == 2; }, &arrived));
  });
  EXPECT_EQ(threads.size(), 2u);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialised) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int k = 0; k < 50; ++k) pool.ParallelFor(10, [&](int64_t i) { sum += i; });
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 50 * 45);
}

TEST(ThreadPoolTest, TasksMayCallParallelForOnAnotherPool) {
  ThreadPool outer(2);
  ThreadPool inner(2);
  constexpr int64_t kOuter = 4;
  constexpr int64_t kInner = 3;
  std::vector<std::atomic<int>> runs(kOuter * kInner);
  outer.ParallelFor(kOuter, [&](int64_t i) {
    inner.ParallelFor(kInner, [&](int64_t j) { runs[i * kInner + j].fetch_add(1); });
  });
  for (int64_t k = 0; k < kOuter * kInner; ++k) EXPECT_EQ(runs[k].load(), 1) << k;
}

TEST(ThreadPoolDeathTest, TaskCallingParallelForOnItsOwnPoolAborts) {
  if (!ZS_DCHECK_IS_ON()) GTEST_SKIP() << "NDEBUG build: the check is compiled out";
  // The child runs the test from the start, so the pool's worker threads exist there too.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // One thread: tasks run inline on the caller; two: also on a worker.
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    EXPECT_DEATH(pool.ParallelFor(2, [&](int64_t) { pool.ParallelFor(1, [](int64_t) {}); }),
                 "a task called ParallelFor on its own pool")
        << threads << " threads";
  }
}

}  // namespace
}  // namespace zeroshard::kernels
