// FileStore: a Store kept as files in one directory, shared by processes on one machine (the
// multi-process tests and the local collective benchmark).
#ifndef ZEROSHARD_WORKER_COMM_FILE_STORE_H_
#define ZEROSHARD_WORKER_COMM_FILE_STORE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "worker/comm/store.h"

namespace zeroshard::comm {

// One file per key (the name is the key with bytes outside [A-Za-z0-9._-] escaped as %XX).
// Set writes a temporary file and renames it into place, so a reader sees a whole value or none;
// Add holds an flock on "<directory>/.lock" around its read-modify-write; Get polls for the file
// until its deadline (every 1 ms at first, backing off to 20 ms).
//
// Thread contract: thread-safe, and safe across processes sharing the directory.
class FileStore : public Store {
 public:
  // `directory` must exist.
  explicit FileStore(std::string directory);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;

 private:
  std::string PathOf(absl::string_view key) const;
  absl::Status WriteAtomically(const std::string& path, absl::string_view value);

  const std::string directory_;
  // Makes temporary file names unique within this process.
  std::atomic<uint64_t> next_temporary_{0};
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_FILE_STORE_H_
