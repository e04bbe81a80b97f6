// SharedMemoryBacking: one memfd per block.
#include "worker/attach/shared_memory_backing.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace zeroshard::attach {

SharedMemoryBacking::~SharedMemoryBacking() {
  absl::MutexLock lock(&mu_);
  for (const auto& [start, block] : by_start_) {
    ::munmap(block.data, static_cast<size_t>(block.bytes));
    ::close(block.fd);
  }
}

void* SharedMemoryBacking::AllocateZeroed(int64_t bytes) {
  // mmap refuses 0 bytes; an empty block still gets its own page.
  const int64_t size = std::max<int64_t>(bytes, 1);
  const int fd = ::memfd_create("zeroshard-engine", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (::ftruncate(fd, size) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* data =
      ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  by_start_[reinterpret_cast<uintptr_t>(data)] =
      Block{next_id_++, fd, static_cast<char*>(data), size};
  return data;
}

void SharedMemoryBacking::Free(void* data) {
  if (data == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = by_start_.find(reinterpret_cast<uintptr_t>(data));
  if (it == by_start_.end()) return;
  ::munmap(it->second.data, static_cast<size_t>(it->second.bytes));
  ::close(it->second.fd);
  by_start_.erase(it);
}

std::optional<SharedMemoryBacking::Block> SharedMemoryBacking::Find(const void* address) const {
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  absl::MutexLock lock(&mu_);
  auto it = by_start_.upper_bound(at);
  if (it == by_start_.begin()) return std::nullopt;
  --it;
  if (at >= it->first + static_cast<uintptr_t>(it->second.bytes)) return std::nullopt;
  return it->second;
}

std::optional<SharedMemoryBacking::Block> SharedMemoryBacking::FindById(int id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [start, block] : by_start_) {
    if (block.id == id) return block;
  }
  return std::nullopt;
}

}  // namespace zeroshard::attach
