// AbortSignal: a flag and the callbacks to run when it is set.
#include "worker/comm/abort_signal.h"

#include <utility>

#include "common/dcheck.h"

namespace zeroshard::comm {

AbortSignal::Registration::Registration(Registration&& other) noexcept
    : signal_(std::exchange(other.signal_, nullptr)), id_(other.id_) {}

AbortSignal::Registration::~Registration() {
  if (signal_ != nullptr) signal_->Unregister(id_);
}

AbortSignal::~AbortSignal() {
  absl::MutexLock lock(&mu_);
  ZS_DCHECK(callbacks_.empty()) << "an AbortSignal outlived by a Registration";
}

void AbortSignal::Abort() {
  absl::MutexLock lock(&mu_);
  if (aborted_) return;
  aborted_ = true;
  for (auto& [id, on_abort] : callbacks_) on_abort();
  callbacks_.clear();
}

bool AbortSignal::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

AbortSignal::Registration AbortSignal::OnAbort(std::function<void()> on_abort) {
  absl::MutexLock lock(&mu_);
  if (aborted_) {
    on_abort();
    return Registration(nullptr, 0);
  }
  const uint64_t id = next_id_++;
  callbacks_.emplace(id, std::move(on_abort));
  return Registration(this, id);
}

void AbortSignal::Unregister(uint64_t id) {
  // Taking the lock is what waits for a callback that Abort() is running.
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace zeroshard::comm
