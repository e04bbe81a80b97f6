// CountingAllocator: the one place the engine gets its large buffers from. It counts live and
// peak bytes per category, so the memory figures the engine reports are measured, not computed.
#ifndef ZEROSHARD_WORKER_ENGINE_COUNTING_ALLOCATOR_H_
#define ZEROSHARD_WORKER_ENGINE_COUNTING_ALLOCATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace zeroshard::engine {

// What a buffer holds.
enum class MemoryCategory : int {
  kParams = 0,          // the parameter-dtype copy: the full model, or the owned pieces (zero3)
  kGrads = 1,           // gradients: the full buffer (ddp, zero1) or the owned pieces (zero2)
  kMaster = 2,          // fp32 master weights
  kOptimizerState = 3,  // fp32 optimizer state arrays (e.g. Adam's exp_avg, exp_avg_sq)
  kBuckets = 4,         // reduce-dtype bucket buffers in flight (zero2, or a dtype change)
  kCommScratch = 5,     // the engine's own communication scratch (the statistics all-reduce)
  kGatherPool = 6,      // zero3's gather buffers: full parameters of the buckets in use
};
inline constexpr int kNumMemoryCategories = 7;

const char* MemoryCategoryName(MemoryCategory category);

// Bytes per category at one moment, plus the peak of the total since the allocator was made.
struct MemoryReport {
  std::array<int64_t, kNumMemoryCategories> bytes = {};
  int64_t peak_total_bytes = 0;

  int64_t of(MemoryCategory category) const { return bytes[static_cast<int>(category)]; }
  int64_t total() const;
  // One line, e.g. "params=2.0MiB grads=... total=...".
  std::string ToString() const;
};

class CountingAllocator;

// Where a CountingAllocator's blocks come from: host memory by default (HostMemoryBacking), device
// memory for engines on a GPU. Implementations are thread-safe.
class MemoryBacking {
 public:
  virtual ~MemoryBacking() = default;
  // A zero-filled block of `bytes` (> 0) bytes, 64-byte aligned; null when out of memory.
  virtual void* AllocateZeroed(int64_t bytes) = 0;
  // Returns a block from AllocateZeroed.
  virtual void Free(void* data) = 0;
};

// Host memory: std::aligned_alloc and std::memset, std::free. Stateless and thread-safe.
class HostMemoryBacking final : public MemoryBacking {
 public:
  void* AllocateZeroed(int64_t bytes) override;
  void Free(void* data) override;
};

// A zero-filled, 64-byte-aligned block owned by one holder; returns its bytes to the
// allocator's count when destroyed. Movable, not copyable. The allocator must outlive it.
class CountedBuffer {
 public:
  CountedBuffer() = default;
  ~CountedBuffer();
  CountedBuffer(CountedBuffer&& other) noexcept;
  CountedBuffer& operator=(CountedBuffer&& other) noexcept;
  CountedBuffer(const CountedBuffer&) = delete;
  CountedBuffer& operator=(const CountedBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  friend class CountingAllocator;
  CountedBuffer(CountingAllocator* owner, MemoryCategory category, void* data, int64_t bytes)
      : owner_(owner), category_(category), data_(data), bytes_(bytes) {}
  void Release();

  CountingAllocator* owner_ = nullptr;
  MemoryCategory category_ = MemoryCategory::kParams;
  void* data_ = nullptr;  // null iff bytes_ == 0 or moved-from
  int64_t bytes_ = 0;
};

// The most bytes a limit may name: 2^50 (1 PiB), far from int64 overflow when live bytes and a
// request are added to it.
inline constexpr int64_t kMaxMemoryLimitBytes = int64_t{1} << 50;

// Thread-safe: Allocate, TryAllocate, SetLimit, buffer destruction and Report may run on any
// threads. With a limit, live bytes never exceed it: a request is checked and its bytes reserved
// under one lock before the backing allocates, so concurrent requests cannot pass it together.
class CountingAllocator {
 public:
  // Blocks from host memory.
  CountingAllocator();
  // Blocks from `backing`, which must outlive the allocator.
  explicit CountingAllocator(MemoryBacking* backing);
  ~CountingAllocator();  // every buffer must have been released (CHECKed)
  CountingAllocator(const CountingAllocator&) = delete;
  CountingAllocator& operator=(const CountingAllocator&) = delete;

  // The most bytes the allocator may hold at once (the worker's --memory_limit_bytes); 0: no
  // limit (the default). Applies to the allocations after it; buffers already held stay (a limit
  // below them refuses every further non-empty allocation). InvalidArgument naming the flag
  // outside [0, kMaxMemoryLimitBytes].
  absl::Status SetLimit(int64_t limit_bytes);
  int64_t limit() const;

  // A zero-filled buffer of `bytes` bytes (>= 0; 0 gives an empty buffer). Aborts on
  // out-of-memory, as operator new does, and (logging TryAllocate's message) on an allocation
  // the limit refuses: callers that run under a limit use TryAllocate.
  CountedBuffer Allocate(MemoryCategory category, int64_t bytes);
  // As Allocate, but out-of-memory is ResourceExhausted (for device memory, where running out
  // is an expected failure of a too-large job rather than a crash), and so is an allocation that
  // would take the live bytes past the limit: its message names the limit as
  // --memory_limit_bytes=N, the bytes asked, the category and the bytes already held.
  absl::StatusOr<CountedBuffer> TryAllocate(MemoryCategory category, int64_t bytes);

  MemoryReport Report() const;

 private:
  friend class CountedBuffer;
  void Free(MemoryCategory category, void* data, int64_t bytes);

  HostMemoryBacking host_backing_;
  MemoryBacking* const backing_;  // &host_backing_ or the constructor's
  mutable absl::Mutex mu_;
  // Live bytes per category; each is the sum of the sizes of unreleased buffers of it.
  std::array<int64_t, kNumMemoryCategories> live_bytes_ ABSL_GUARDED_BY(mu_) = {};
  int64_t live_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t limit_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_COUNTING_ALLOCATOR_H_
