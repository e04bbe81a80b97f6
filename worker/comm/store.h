// The rendezvous Store: a small key-value space shared by the ranks of one generation, used to
// exchange connection details (Gloo addresses, the NCCL unique id) before any collective runs.
#ifndef ZEROSHARD_WORKER_COMM_STORE_H_
#define ZEROSHARD_WORKER_COMM_STORE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zeroshard::comm {

// Implementations: InMemoryStore (threads as ranks), FileStore (processes on one machine),
// CoordinatorStore (the coordinator's store RPCs, scoped to a job and generation).
//
// Thread contract: every implementation is thread-safe.
class Store {
 public:
  virtual ~Store() = default;

  // Creates or replaces `key`.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to be set. DEADLINE_EXCEEDED when
  // it does not appear in time; a zero timeout does not wait.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;

  // Adds `delta` atomically to the counter `key` (a missing key counts as 0) and returns the new
  // value. Counters are stored as decimal text, so Get returns e.g. "3". FAILED_PRECONDITION
  // when the key holds something that is not a counter.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;

  // Removes `key`; returns whether it existed.
  virtual absl::StatusOr<bool> Delete(absl::string_view key) = 0;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_STORE_H_
