// SharedMemoryBacking: blocks are zeroed, found by address and id, and shared through their
// descriptor (a second mapping of the fd sees the same bytes, as a trainer's does).
#include "worker/attach/shared_memory_backing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gtest/gtest.h"

namespace zeroshard::attach {
namespace {

TEST(SharedMemoryBackingTest, BlocksAreZeroedFoundAndSharedThroughTheirDescriptor) {
  SharedMemoryBacking backing;
  char* first = static_cast<char*>(backing.AllocateZeroed(10000));
  char* second = static_cast<char*>(backing.AllocateZeroed(0));
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  for (int k = 0; k < 10000; ++k) ASSERT_EQ(first[k], 0) << k;

  std::optional<SharedMemoryBacking::Block> inside = backing.Find(first + 9999);
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->data, first);
  EXPECT_EQ(inside->bytes, 10000);
  EXPECT_EQ(inside->id, 0);
  EXPECT_EQ(backing.Find(second)->id, 1);
  EXPECT_EQ(backing.FindById(1)->data, second);
  int stack_value = 0;
  EXPECT_FALSE(backing.Find(&stack_value).has_value());

  // Another mapping of the descriptor (what the trainer makes) sees and makes the same writes.
  void* other = mmap(nullptr, 10000, PROT_READ | PROT_WRITE, MAP_SHARED, inside->fd, 0);
  ASSERT_NE(other, MAP_FAILED);
  std::strcpy(first + 100, "engine");
  EXPECT_STREQ(static_cast<char*>(other) + 100, "engine");
  std::strcpy(static_cast<char*>(other) + 200, "trainer");
  EXPECT_STREQ(first + 200, "trainer");
  munmap(other, 10000);

  backing.Free(first);
  EXPECT_FALSE(backing.FindById(0).has_value());
  EXPECT_FALSE(backing.Find(first).has_value());
  EXPECT_TRUE(backing.FindById(1).has_value());
}

// Issue 25, item 1: a trainer holding a block's descriptor could ftruncate it to 0, and the
// worker's next access raised SIGBUS, killing the daemon (before, memfds were not sealable).
// Now the size is sealed: the truncation fails with EPERM and the worker's memory stays.
TEST(SharedMemoryBackingTest, ATrainerCannotShrinkGrowOrUnsealABlock) {
  SharedMemoryBacking backing;
  char* block = static_cast<char*>(backing.AllocateZeroed(8192));
  ASSERT_NE(block, nullptr);
  const int fd = backing.Find(block)->fd;
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(fd, 1 << 20), -1);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  EXPECT_EQ(::fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  block[8191] = 7;  // still mapped, still backed: no SIGBUS
  EXPECT_EQ(block[8191], 7);
}

}  // namespace
}  // namespace zeroshard::attach
