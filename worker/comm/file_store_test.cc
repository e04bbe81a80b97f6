// FileStore: the Store contract on a directory, including counters from many threads.
#include "worker/comm/file_store.h"

#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::comm {
namespace {

std::string FreshDirectory(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string directory = std::string(root != nullptr ? root : "/tmp") + "/" + name;
  std::system(("rm -rf '" + directory + "' && mkdir -p '" + directory + "'").c_str());
  return directory;
}

TEST(FileStoreTest, SetGetOverwriteAndOddKeys) {
  FileStore store(FreshDirectory("set_get"));
  ASSERT_TRUE(store.Set("gloo/0", std::string("a\0b", 3)).ok());
  auto value = store.Get("gloo/0", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("a\0b", 3));
  ASSERT_TRUE(store.Set("gloo/0", "second").ok());
  EXPECT_EQ(*store.Get("gloo/0", absl::ZeroDuration()), "second");
  EXPECT_EQ(store.Get("gloo%2F0", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(FileStoreTest, GetWaitsForALaterSetAndTimesOut) {
  FileStore store(FreshDirectory("wait"));
  EXPECT_EQ(store.Get("missing", absl::Milliseconds(30)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread setter([&store] { ASSERT_TRUE(store.Set("late", "x").ok()); });
  auto value = store.Get("late", absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "x");
}

TEST(FileStoreTest, AddIsAtomicAcrossThreads) {
  FileStore store(FreshDirectory("add"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store] {
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(store.Add("counter", 1).ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(*store.Add("counter", 0), 200);
  ASSERT_TRUE(store.Set("text", "abc").ok());
  EXPECT_EQ(store.Add("text", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FileStoreTest, Delete) {
  FileStore store(FreshDirectory("delete"));
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_TRUE(*store.Delete("k"));
  EXPECT_FALSE(*store.Delete("k"));
}

}  // namespace
}  // namespace zeroshard::comm
