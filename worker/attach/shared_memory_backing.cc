// SharedMemoryBacking: one memfd per block, its size sealed.
#include "worker/attach/shared_memory_backing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace zeroshard::attach {

SharedMemoryBacking::~SharedMemoryBacking() {
  for (const Block& block : blocks_.RemoveAll()) {
    ::munmap(block.data, static_cast<size_t>(block.bytes));
    ::close(block.fd);
  }
}

void* SharedMemoryBacking::AllocateZeroed(int64_t bytes) {
  // mmap refuses 0 bytes; an empty block still gets its own page.
  const int64_t size = std::max<int64_t>(bytes, 1);
  const int fd = ::memfd_create("zeroshard-engine", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  // The size sealed: a trainer holding the descriptor cannot shrink the block under the worker's
  // mapping (its next access would be SIGBUS, killing the daemon and every run on it), nor grow
  // it, nor change the seals.
  if (::ftruncate(fd, size) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* data =
      ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  Block block;
  block.fd = fd;
  block.data = static_cast<char*>(data);
  block.bytes = size;
  blocks_.Add(std::move(block));
  return data;
}

void SharedMemoryBacking::Free(void* data) {
  if (data == nullptr) return;
  const std::optional<Block> block = blocks_.Remove(data);
  if (!block.has_value()) return;
  ::munmap(block->data, static_cast<size_t>(block->bytes));
  ::close(block->fd);
}

}  // namespace zeroshard::attach
