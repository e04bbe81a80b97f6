// CountingAllocator: per-category live bytes, peak, zeroed and aligned memory, moves.
#include "worker/engine/counting_allocator.h"

#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace zeroshard::engine {
namespace {

TEST(CountingAllocatorTest, CountsLiveBytesPerCategoryAndPeak) {
  CountingAllocator allocator;
  {
    CountedBuffer params = allocator.Allocate(MemoryCategory::kParams, 1000);
    CountedBuffer state = allocator.Allocate(MemoryCategory::kOptimizerState, 24);
    MemoryReport report = allocator.Report();
    EXPECT_EQ(report.of(MemoryCategory::kParams), 1000);
    EXPECT_EQ(report.of(MemoryCategory::kOptimizerState), 24);
    EXPECT_EQ(report.of(MemoryCategory::kGrads), 0);
    EXPECT_EQ(report.total(), 1024);
    EXPECT_EQ(report.peak_total_bytes, 1024);
  }
  MemoryReport after = allocator.Report();
  EXPECT_EQ(after.total(), 0);
  EXPECT_EQ(after.peak_total_bytes, 1024);
}

TEST(CountingAllocatorTest, MemoryIsZeroedAndAligned) {
  CountingAllocator allocator;
  CountedBuffer buffer = allocator.Allocate(MemoryCategory::kGrads, 4096);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 64, 0u);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(buffer.as<unsigned char>()[i], 0) << i;
}

TEST(CountingAllocatorTest, MovedBufferIsCountedOnce) {
  CountingAllocator allocator;
  CountedBuffer first = allocator.Allocate(MemoryCategory::kBuckets, 100);
  CountedBuffer second = std::move(first);
  EXPECT_EQ(first.data(), nullptr);
  EXPECT_EQ(allocator.Report().of(MemoryCategory::kBuckets), 100);
  second = allocator.Allocate(MemoryCategory::kBuckets, 10);
  EXPECT_EQ(allocator.Report().of(MemoryCategory::kBuckets), 10);
  CountedBuffer empty = allocator.Allocate(MemoryCategory::kMaster, 0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(allocator.Report().of(MemoryCategory::kMaster), 0);
}

// Fails before the fix: the allocator had no limit; every allocation the backing could serve
// succeeded.
TEST(CountingAllocatorTest, LimitRefusesAnAllocationThatWouldPassItAndNamesTheFigures) {
  CountingAllocator allocator;
  ASSERT_TRUE(allocator.SetLimit(10000).ok());
  EXPECT_EQ(allocator.limit(), 10000);
  CountedBuffer params = allocator.Allocate(MemoryCategory::kParams, 6000);
  absl::StatusOr<CountedBuffer> state =
      allocator.TryAllocate(MemoryCategory::kOptimizerState, 4000);
  ASSERT_TRUE(state.ok()) << state.status();  // exactly at the limit is allowed
  absl::StatusOr<CountedBuffer> pool = allocator.TryAllocate(MemoryCategory::kGatherPool, 1);
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(pool.status().message());
  EXPECT_NE(message.find("--memory_limit_bytes=10000"), std::string::npos) << message;
  EXPECT_NE(message.find("allocating 1 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("gather_pool"), std::string::npos) << message;
  EXPECT_NE(message.find("10000 bytes (0.0 MiB) already held"), std::string::npos) << message;
  EXPECT_NE(message.find("params=6000 optimizer_state=4000"), std::string::npos) << message;
  // A refusal leaves the counts as they were; freeing makes room again.
  EXPECT_EQ(allocator.Report().total(), 10000);
  EXPECT_EQ(allocator.Report().peak_total_bytes, 10000);
  *state = CountedBuffer();
  absl::StatusOr<CountedBuffer> retry = allocator.TryAllocate(MemoryCategory::kGatherPool, 4000);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(allocator.Report().of(MemoryCategory::kGatherPool), 4000);
  // Empty buffers never count against it.
  EXPECT_TRUE(allocator.TryAllocate(MemoryCategory::kBuckets, 0).ok());
}

TEST(CountingAllocatorTest, NoLimitByDefaultAndZeroRemovesIt) {
  CountingAllocator allocator;
  EXPECT_EQ(allocator.limit(), 0);
  ASSERT_TRUE(allocator.SetLimit(100).ok());
  EXPECT_FALSE(allocator.TryAllocate(MemoryCategory::kParams, 101).ok());
  ASSERT_TRUE(allocator.SetLimit(0).ok());
  EXPECT_TRUE(allocator.TryAllocate(MemoryCategory::kParams, 101).ok());
}

TEST(CountingAllocatorTest, SetLimitRefusesValuesOutOfRangeNamingTheFlag) {
  CountingAllocator allocator;
  for (int64_t bad : {int64_t{-1}, kMaxMemoryLimitBytes + 1}) {
    const absl::Status status = allocator.SetLimit(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("--memory_limit_bytes"), absl::string_view::npos) << status;
  }
  EXPECT_TRUE(allocator.SetLimit(kMaxMemoryLimitBytes).ok());
}

// Threads allocating at once cannot pass the limit together: each request is checked and reserved
// under one lock.
TEST(CountingAllocatorTest, ConcurrentAllocationsNeverPassTheLimit) {
  CountingAllocator allocator;
  ASSERT_TRUE(allocator.SetLimit(64 * 1000).ok());
  std::vector<std::vector<CountedBuffer>> held(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&allocator, &held, t] {
      for (int i = 0; i < 50; ++i) {
        absl::StatusOr<CountedBuffer> buffer =
            allocator.TryAllocate(MemoryCategory::kBuckets, 1000);
        if (buffer.ok()) held[t].push_back(*std::move(buffer));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  size_t granted = 0;
  for (const auto& buffers : held) granted += buffers.size();
  EXPECT_EQ(granted, 64u);
  EXPECT_EQ(allocator.Report().peak_total_bytes, 64 * 1000);
}

TEST(CountingAllocatorDeathTest, AllocateAbortsWithTheMessageWhenTheLimitRefuses) {
  EXPECT_DEATH(
      {
        CountingAllocator allocator;
        if (!allocator.SetLimit(100).ok()) return;
        CountedBuffer buffer = allocator.Allocate(MemoryCategory::kGrads, 200);
      },
      "--memory_limit_bytes=100");
}

}  // namespace
}  // namespace zeroshard::engine
