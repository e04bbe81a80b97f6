// CudaIpcBacking: engine memory on a CUDA device that an attached trainer opens through CUDA IPC
// handles (docs/pytorch.md, "CUDA workers"). Built only under --config=cuda; this header has no
// CUDA includes.
#ifndef ZEROSHARD_WORKER_ATTACH_CUDA_IPC_BACKING_H_
#define ZEROSHARD_WORKER_ATTACH_CUDA_IPC_BACKING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/attach/shared_blocks.h"

namespace zeroshard::attach {

// Every block is its own cudaMalloc allocation, so that its cudaIpcMemHandle_t (taken once, at
// allocation) opens in the trainer at the block's byte 0; the engine's offsets are within a
// block. Blocks are zero-filled before AllocateZeroed returns.
//
// Free does not wait for the device: CudaDeviceOps::Free, through which the engine frees,
// synchronizes the device before it hands a block back here. The engine frees its blocks when the
// run ends, after the trainer finished or was lost (its opened handles go with its process).
//
// Thread contract: thread-safe (every call selects the device itself).
class CudaIpcBacking final : public SharedBlocks {
 public:
  // FailedPrecondition when there is no such device.
  static absl::StatusOr<std::unique_ptr<CudaIpcBacking>> Create(int device);
  // cudaFree of the blocks still allocated.
  ~CudaIpcBacking() override;
  CudaIpcBacking(const CudaIpcBacking&) = delete;
  CudaIpcBacking& operator=(const CudaIpcBacking&) = delete;

  // Null on any CUDA error (logged).
  void* AllocateZeroed(int64_t bytes) override;
  void Free(void* data) override;

  SharedDevice device() const override { return device_; }
  std::optional<SharedBlock> Find(const void* address) const override {
    return blocks_.Find(address);
  }
  std::optional<SharedBlock> FindById(int id) const override { return blocks_.FindById(id); }

 private:
  explicit CudaIpcBacking(SharedDevice device) : device_(std::move(device)) {}

  const SharedDevice device_;
  SharedBlockTable blocks_;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_CUDA_IPC_BACKING_H_
