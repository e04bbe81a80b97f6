// SharedBlockTable: blocks by start address, behind one mutex.
#include "worker/attach/shared_blocks.h"

#include <utility>

namespace zeroshard::attach {

int SharedBlockTable::Add(SharedBlock block) {
  absl::MutexLock lock(&mu_);
  block.id = next_id_++;
  const int id = block.id;
  by_start_[reinterpret_cast<uintptr_t>(block.data)] = std::move(block);
  return id;
}

std::optional<SharedBlock> SharedBlockTable::Remove(const void* data) {
  absl::MutexLock lock(&mu_);
  auto it = by_start_.find(reinterpret_cast<uintptr_t>(data));
  if (it == by_start_.end()) return std::nullopt;
  SharedBlock block = std::move(it->second);
  by_start_.erase(it);
  return block;
}

std::vector<SharedBlock> SharedBlockTable::RemoveAll() {
  absl::MutexLock lock(&mu_);
  std::vector<SharedBlock> blocks;
  blocks.reserve(by_start_.size());
  for (auto& [start, block] : by_start_) blocks.push_back(std::move(block));
  by_start_.clear();
  return blocks;
}

std::optional<SharedBlock> SharedBlockTable::Find(const void* address) const {
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  absl::MutexLock lock(&mu_);
  auto it = by_start_.upper_bound(at);
  if (it == by_start_.begin()) return std::nullopt;
  --it;
  if (at >= it->first + static_cast<uintptr_t>(it->second.bytes)) return std::nullopt;
  return it->second;
}

std::optional<SharedBlock> SharedBlockTable::FindById(int id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [start, block] : by_start_) {
    if (block.id == id) return block;
  }
  return std::nullopt;
}

}  // namespace zeroshard::attach
