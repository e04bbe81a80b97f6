// A Store held in this process's memory, for threads-as-ranks tests.
#ifndef ZEROSHARD_WORKER_COMM_IN_MEMORY_STORE_H_
#define ZEROSHARD_WORKER_COMM_IN_MEMORY_STORE_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/store.h"

namespace zeroshard::comm {

// Thread-safe: one mutex guards the map; Get waits on it with a deadline.
class InMemoryStore : public Store {
 public:
  InMemoryStore() = default;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_IN_MEMORY_STORE_H_
