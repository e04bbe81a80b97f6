// InMemoryStore: a mutex-guarded map; Get awaits the key with a deadline.
#include "worker/comm/in_memory_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zeroshard::comm {

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_[key] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  const std::string wanted(key);
  absl::MutexLock lock(&mu_);
  auto present = [this, &wanted]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(wanted); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key '", key, "' not set within ", absl::FormatDuration(timeout)));
  }
  return values_.at(wanted);
}

absl::StatusOr<int64_t> InMemoryStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  int64_t value = 0;
  if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store key '", key, "' does not hold a counter"));
  }
  value += delta;
  values_[key] = absl::StrCat(value);
  return value;
}

absl::StatusOr<bool> InMemoryStore::Delete(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  return values_.erase(key) > 0;
}

}  // namespace zeroshard::comm
