// SharedBlocks: engine memory that an attached trainer maps block by block, whatever the device
// (memfd blocks on the CPU, CUDA IPC handles on a GPU), and the table of blocks both keep.
#ifndef ZEROSHARD_WORKER_ATTACH_SHARED_BLOCKS_H_
#define ZEROSHARD_WORKER_ATTACH_SHARED_BLOCKS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/counting_allocator.h"

namespace zeroshard::attach {

// One allocation the trainer maps whole: the engine's offsets into it travel in the welcome.
struct SharedBlock {
  int id = -1;
  int fd = -1;  // host blocks: the memfd, owned by the backing (dup() it to keep it beyond Free)
  char* data = nullptr;
  int64_t bytes = 0;
  // CUDA blocks: the cudaIpcMemHandle_t (64 bytes) of the block's own cudaMalloc allocation,
  // which opens at the block's byte 0; empty for host blocks.
  std::string cuda_ipc_handle;
};

// The device whose memory the blocks are, as the welcome describes it to the trainer.
struct SharedDevice {
  std::string kind = "cpu";  // "cpu" or "cuda"
  int ordinal = -1;          // cuda: the worker's device ordinal
  std::string pci_bus_id;    // cuda: e.g. "0000:3B:00.0", the same in every process
  std::string uuid;          // cuda: 16 bytes
};

// A MemoryBacking whose blocks another process can map. Implementations are thread-safe.
class SharedBlocks : public engine::MemoryBacking {
 public:
  ~SharedBlocks() override = default;

  virtual SharedDevice device() const = 0;
  // The block holding byte `address`, if any.
  virtual std::optional<SharedBlock> Find(const void* address) const = 0;
  // The block numbered `id`, if it is still allocated.
  virtual std::optional<SharedBlock> FindById(int id) const = 0;
};

// The live blocks of a SharedBlocks, numbered in the order they were added (ids are never
// reused). Thread contract: thread-safe.
class SharedBlockTable {
 public:
  // Numbers `block` (its id is overwritten) and returns the number.
  int Add(SharedBlock block);
  // Removes the block that starts at `data` and returns it; nullopt when there is none.
  std::optional<SharedBlock> Remove(const void* data);
  // Removes every block and returns them (for the owner's destructor).
  std::vector<SharedBlock> RemoveAll();
  std::optional<SharedBlock> Find(const void* address) const;
  std::optional<SharedBlock> FindById(int id) const;

 private:
  mutable absl::Mutex mu_;
  std::map<uintptr_t, SharedBlock> by_start_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_SHARED_BLOCKS_H_
