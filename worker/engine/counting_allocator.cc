// CountingAllocator: aligned, zeroed allocations counted per category.
#include "worker/engine/counting_allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace zeroshard::engine {
namespace {

constexpr size_t kAlignment = 64;

}  // namespace

const char* MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParams:
      return "params";
    case MemoryCategory::kGrads:
      return "grads";
    case MemoryCategory::kMaster:
      return "master";
    case MemoryCategory::kOptimizerState:
      return "optimizer_state";
    case MemoryCategory::kBuckets:
      return "buckets";
    case MemoryCategory::kCommScratch:
      return "comm_scratch";
    case MemoryCategory::kGatherPool:
      return "gather_pool";
  }
  return "invalid";
}

int64_t MemoryReport::total() const {
  int64_t sum = 0;
  for (int64_t value : bytes) sum += value;
  return sum;
}

std::string MemoryReport::ToString() const {
  std::string out;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    absl::StrAppendFormat(&out, "%s=%.3fMiB ", MemoryCategoryName(static_cast<MemoryCategory>(i)),
                          bytes[i] / 1048576.0);
  }
  absl::StrAppendFormat(&out, "total=%.3fMiB peak=%.3fMiB", total() / 1048576.0,
                        peak_total_bytes / 1048576.0);
  return out;
}

CountedBuffer::~CountedBuffer() { Release(); }

CountedBuffer::CountedBuffer(CountedBuffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      category_(other.category_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

CountedBuffer& CountedBuffer::operator=(CountedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    category_ = other.category_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void CountedBuffer::Release() {
  if (owner_ != nullptr) owner_->Free(category_, data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void* HostMemoryBacking::AllocateZeroed(int64_t bytes) {
  const size_t rounded = (static_cast<size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded);
  if (data != nullptr) std::memset(data, 0, rounded);
  return data;
}

void HostMemoryBacking::Free(void* data) { std::free(data); }

CountingAllocator::CountingAllocator() : backing_(&host_backing_) {}

CountingAllocator::CountingAllocator(MemoryBacking* backing) : backing_(backing) {}

CountingAllocator::~CountingAllocator() {
  absl::MutexLock lock(&mu_);
  if (live_total_ != 0) {
    ZS_LOG(FATAL) << "CountingAllocator destroyed with " << live_total_ << " bytes still allocated";
  }
}

absl::Status CountingAllocator::SetLimit(int64_t limit_bytes) {
  if (limit_bytes < 0 || limit_bytes > kMaxMemoryLimitBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--memory_limit_bytes: must be in [0, ",
                                                   kMaxMemoryLimitBytes, "] (0: no limit), got ",
                                                   limit_bytes));
  }
  absl::MutexLock lock(&mu_);
  limit_bytes_ = limit_bytes;
  return absl::OkStatus();
}

int64_t CountingAllocator::limit() const {
  absl::MutexLock lock(&mu_);
  return limit_bytes_;
}

CountedBuffer CountingAllocator::Allocate(MemoryCategory category, int64_t bytes) {
  absl::StatusOr<CountedBuffer> buffer = TryAllocate(category, bytes);
  if (!buffer.ok()) {
    if (limit() > 0) ZS_LOG(FATAL) << buffer.status();
    throw std::bad_alloc();
  }
  return *std::move(buffer);
}

absl::StatusOr<CountedBuffer> CountingAllocator::TryAllocate(MemoryCategory category,
                                                             int64_t bytes) {
  if (bytes < 0) ZS_LOG(FATAL) << "negative allocation of " << bytes << " bytes";
  if (bytes == 0) return CountedBuffer(this, category, nullptr, 0);
  {
    // Checked and reserved under one lock, so concurrent requests cannot pass the limit together.
    absl::MutexLock lock(&mu_);
    if (limit_bytes_ > 0 && bytes > limit_bytes_ - live_total_) {
      std::string held;
      for (int i = 0; i < kNumMemoryCategories; ++i) {
        if (live_bytes_[i] == 0) continue;
        absl::StrAppendFormat(&held, "%s%s=%d", held.empty() ? "" : " ",
                              MemoryCategoryName(static_cast<MemoryCategory>(i)), live_bytes_[i]);
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "--memory_limit_bytes=%d (%.1f MiB): allocating %d bytes (%.1f MiB) of %s would pass "
          "it; %d bytes (%.1f MiB) already held (%s)",
          limit_bytes_, limit_bytes_ / 1048576.0, bytes, bytes / 1048576.0,
          MemoryCategoryName(category), live_total_, live_total_ / 1048576.0,
          held.empty() ? "nothing" : held));
    }
    live_bytes_[static_cast<int>(category)] += bytes;
    live_total_ += bytes;
  }
  void* data = backing_->AllocateZeroed(bytes);
  absl::MutexLock lock(&mu_);
  if (data == nullptr) {
    live_bytes_[static_cast<int>(category)] -= bytes;
    live_total_ -= bytes;
    return absl::ResourceExhaustedError(absl::StrCat("out of memory allocating ", bytes,
                                                     " bytes of ", MemoryCategoryName(category)));
  }
  if (live_total_ > peak_total_) peak_total_ = live_total_;
  return CountedBuffer(this, category, data, bytes);
}

void CountingAllocator::Free(MemoryCategory category, void* data, int64_t bytes) {
  backing_->Free(data);
  absl::MutexLock lock(&mu_);
  live_bytes_[static_cast<int>(category)] -= bytes;
  live_total_ -= bytes;
}

MemoryReport CountingAllocator::Report() const {
  absl::MutexLock lock(&mu_);
  MemoryReport report;
  report.bytes = live_bytes_;
  report.peak_total_bytes = peak_total_;
  return report;
}

}  // namespace zeroshard::engine
