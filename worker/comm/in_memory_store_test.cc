// InMemoryStore: set/get, waiting for a key another thread sets, counters, deletion.
#include "worker/comm/in_memory_store.h"

#include <thread>

#include "gtest/gtest.h"

namespace zeroshard::comm {
namespace {

TEST(InMemoryStoreTest, SetThenGet) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("a", "2").ok());
  auto value = store.Get("a", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "2");
}

TEST(InMemoryStoreTest, GetOfMissingKeyTimesOut) {
  InMemoryStore store;
  auto value = store.Get("missing", absl::Milliseconds(20));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(InMemoryStoreTest, GetWaitsForAnotherThreadsSet) {
  InMemoryStore store;
  std::thread setter([&store] { ASSERT_TRUE(store.Set("late", "value").ok()); });
  auto value = store.Get("late", absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
}

TEST(InMemoryStoreTest, AddCountsAndRefusesNonCounters) {
  InMemoryStore store;
  EXPECT_EQ(*store.Add("n", 2), 2);
  EXPECT_EQ(*store.Add("n", -5), -3);
  EXPECT_EQ(*store.Get("n", absl::ZeroDuration()), "-3");
  ASSERT_TRUE(store.Set("text", "abc").ok());
  EXPECT_EQ(store.Add("text", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(InMemoryStoreTest, DeleteReportsWhetherTheKeyExisted) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_TRUE(*store.Delete("k"));
  EXPECT_FALSE(*store.Delete("k"));
  EXPECT_EQ(store.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace zeroshard::comm
