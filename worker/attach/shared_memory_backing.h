// SharedMemoryBacking: engine memory in memfd blocks, so that an attached trainer can map the
// parameters and gradient buffers (their descriptors travel over a unix socket).
#ifndef ZEROSHARD_WORKER_ATTACH_SHARED_MEMORY_BACKING_H_
#define ZEROSHARD_WORKER_ATTACH_SHARED_MEMORY_BACKING_H_

#include <cstdint>
#include <optional>

#include "worker/attach/shared_blocks.h"

namespace zeroshard::attach {

// Every block is its own memfd (memfd_create, ftruncate, mmap MAP_SHARED): zero-filled by the
// kernel, page aligned, and mappable by another process that receives the descriptor. Blocks
// are numbered in allocation order (ids are never reused).
//
// Thread contract: thread-safe.
class SharedMemoryBacking final : public SharedBlocks {
 public:
  using Block = SharedBlock;

  SharedMemoryBacking() = default;
  ~SharedMemoryBacking() override;
  SharedMemoryBacking(const SharedMemoryBacking&) = delete;
  SharedMemoryBacking& operator=(const SharedMemoryBacking&) = delete;

  // nullptr when the kernel refuses (no memory, no descriptors).
  void* AllocateZeroed(int64_t bytes) override;
  void Free(void* data) override;

  SharedDevice device() const override { return SharedDevice{}; }
  std::optional<Block> Find(const void* address) const override { return blocks_.Find(address); }
  std::optional<Block> FindById(int id) const override { return blocks_.FindById(id); }

 private:
  SharedBlockTable blocks_;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_SHARED_MEMORY_BACKING_H_
