// GlooStoreAdapter: prefixed keys, blocking get/wait, and Store failures thrown as Gloo
// exceptions (connectFullMesh through it is exercised by every Gloo communicator test).
#include "worker/comm/gloo_store_adapter.h"

#include "gloo/common/error.h"
#include "gtest/gtest.h"
#include "worker/comm/in_memory_store.h"

namespace zeroshard::comm {
namespace {

TEST(GlooStoreAdapterTest, PrefixesKeysAndRoundTripsBytes) {
  InMemoryStore store;
  GlooStoreAdapter adapter(&store, "group", absl::Seconds(5));
  adapter.set("0", std::vector<char>{'a', '\0', 'b'});
  EXPECT_EQ(*store.Get("group/0", absl::ZeroDuration()), std::string("a\0b", 3));
  EXPECT_EQ(adapter.get("0"), (std::vector<char>{'a', '\0', 'b'}));
  adapter.wait({"0"});
}

TEST(GlooStoreAdapterTest, MissingKeysThrowGlooIoExceptionsAfterTheTimeout) {
  InMemoryStore store;
  GlooStoreAdapter adapter(&store, "group", absl::Milliseconds(20));
  EXPECT_THROW(adapter.get("missing"), gloo::IoException);
  EXPECT_THROW(adapter.wait({"missing"}, std::chrono::milliseconds(20)), gloo::IoException);
}

}  // namespace
}  // namespace zeroshard::comm
