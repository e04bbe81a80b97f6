// CountingAllocator: per-category live bytes, peak, zeroed and aligned memory, moves.
#include "worker/engine/counting_allocator.h"

#include <cstdint>
#include <utility>

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

}  // namespace
}  // namespace zeroshard::engine
