// Tests of the kernels' thread pool: every task runs exactly once, on several threads.
#include "kernels/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
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

}  // namespace
}  // namespace zeroshard::kernels
