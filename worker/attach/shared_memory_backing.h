// SharedMemoryBacking: engine memory in memfd blocks, so that an attached trainer can map the
// parameters and gradient buffers (their descriptors travel over a unix socket).
#ifndef ZEROSHARD_WORKER_ATTACH_SHARED_MEMORY_BACKING_H_
#define ZEROSHARD_WORKER_ATTACH_SHARED_MEMORY_BACKING_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/counting_allocator.h"

namespace zeroshard::attach {

// Every block is its own memfd (memfd_create, ftruncate, mmap MAP_SHARED): zero-filled by the
// kernel, page aligned, and mappable by another process that receives the descriptor. Blocks
// are numbered in allocation order (ids are never reused).
//
// Thread contract: thread-safe.
class SharedMemoryBacking final : public engine::MemoryBacking {
 public:
  struct Block {
    int id = -1;
    int fd = -1;  // owned by the backing: dup() it to keep it beyond Free
    char* data = nullptr;
    int64_t bytes = 0;
  };

  SharedMemoryBacking() = default;
  ~SharedMemoryBacking() override;
  SharedMemoryBacking(const SharedMemoryBacking&) = delete;
  SharedMemoryBacking& operator=(const SharedMemoryBacking&) = delete;

  // nullptr when the kernel refuses (no memory, no descriptors).
  void* AllocateZeroed(int64_t bytes) override;
  void Free(void* data) override;

  // The block holding byte `address`, if any.
  std::optional<Block> Find(const void* address) const;
  // The block numbered `id`, if it is still allocated.
  std::optional<Block> FindById(int id) const;

 private:
  mutable absl::Mutex mu_;
  std::map<uintptr_t, Block> by_start_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_SHARED_MEMORY_BACKING_H_
