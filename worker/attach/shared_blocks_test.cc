// Tests for SharedBlockTable: numbering, lookup by address and id, removal.
#include "worker/attach/shared_blocks.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::attach {
namespace {

SharedBlock BlockAt(char* data, int64_t bytes, std::string handle = "") {
  SharedBlock block;
  block.data = data;
  block.bytes = bytes;
  block.cuda_ipc_handle = std::move(handle);
  return block;
}

TEST(SharedBlockTableTest, FindsBlocksByAnyByteAndById) {
  std::vector<char> memory(300);
  SharedBlockTable table;
  const int first = table.Add(BlockAt(memory.data(), 100, std::string(64, 'a')));
  const int second = table.Add(BlockAt(memory.data() + 200, 50));
  EXPECT_NE(first, second);

  std::optional<SharedBlock> inside = table.Find(memory.data() + 99);
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->id, first);
  EXPECT_EQ(inside->cuda_ipc_handle, std::string(64, 'a'));
  EXPECT_FALSE(table.Find(memory.data() + 100).has_value());  // the gap between the blocks
  EXPECT_FALSE(table.Find(memory.data() + 250).has_value());  // one past the second's end
  EXPECT_EQ(table.Find(memory.data() + 249)->id, second);

  std::optional<SharedBlock> by_id = table.FindById(second);
  ASSERT_TRUE(by_id.has_value());
  EXPECT_EQ(by_id->data, memory.data() + 200);
  EXPECT_EQ(by_id->bytes, 50);
  EXPECT_FALSE(table.FindById(second + 1).has_value());
}

TEST(SharedBlockTableTest, RemovedIdsAreNotReused) {
  std::vector<char> memory(64);
  SharedBlockTable table;
  const int first = table.Add(BlockAt(memory.data(), 64));
  EXPECT_FALSE(table.Remove(memory.data() + 1).has_value());  // not a block's start
  std::optional<SharedBlock> removed = table.Remove(memory.data());
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->id, first);
  EXPECT_FALSE(table.FindById(first).has_value());
  EXPECT_FALSE(table.Find(memory.data()).has_value());

  const int again = table.Add(BlockAt(memory.data(), 64));
  EXPECT_NE(again, first);
  const std::vector<SharedBlock> all = table.RemoveAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].id, again);
  EXPECT_FALSE(table.FindById(again).has_value());
}

}  // namespace
}  // namespace zeroshard::attach
