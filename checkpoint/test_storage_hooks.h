// Test support: StorageHooks (directory.h) that record every storage operation, hold the ones a
// test names until it releases them (a coordinator's commit blocked in its manifest write while
// a heartbeat is answered), or fail them.
#ifndef ZEROSHARD_CHECKPOINT_TEST_STORAGE_HOOKS_H_
#define ZEROSHARD_CHECKPOINT_TEST_STORAGE_HOOKS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/directory.h"

namespace zeroshard::checkpoint::testing {

// Thread contract: thread-safe; Before() runs on the storage caller's thread and may block there
// until Release().
class TestStorageHooks : public StorageHooks {
 public:
  struct Operation {
    StorageOperation operation;
    std::string path;
  };

  // From now on, holds every `operation` whose path ends with `path_suffix` until Release().
  void HoldAt(StorageOperation operation, std::string path_suffix) {
    absl::MutexLock lock(&mu_);
    hold_ = Rule{operation, std::move(path_suffix)};
  }
  // Lets the held operations go, and stops holding.
  void Release() {
    absl::MutexLock lock(&mu_);
    ++releases_;
    hold_.reset();
  }
  // Waits until an operation is held, at most `timeout`; whether one is.
  bool AwaitHeld(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto held = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&held), timeout);
  }
  // Operations held right now.
  int held() const {
    absl::MutexLock lock(&mu_);
    return held_;
  }
  // From now on, fails every `operation` whose path ends with `path_suffix` with `status`.
  void FailAt(StorageOperation operation, std::string path_suffix, absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_ = Rule{operation, std::move(path_suffix)};
    failure_ = std::move(status);
  }
  // Runs `action` (on the caller's thread, outside the lock) before every `operation` whose path
  // ends with `path_suffix`: a test plants something at the very moment of the operation.
  void RunAt(StorageOperation operation, std::string path_suffix,
             std::function<void(const std::string& path)> action) {
    absl::MutexLock lock(&mu_);
    run_ = Rule{operation, std::move(path_suffix)};
    action_ = std::move(action);
  }
  // Every operation seen, in order.
  std::vector<Operation> operations() const {
    absl::MutexLock lock(&mu_);
    return operations_;
  }

  absl::Status Before(StorageOperation operation, const std::string& path) override {
    std::function<void(const std::string&)> action;
    {
      absl::MutexLock lock(&mu_);
      operations_.push_back({operation, path});
      if (Matches(fail_, operation, path)) return failure_;
      if (Matches(run_, operation, path)) action = action_;
      if (Matches(hold_, operation, path)) {
        ++held_;
        const int64_t releases = releases_;
        auto released = [this, releases]()
                            ABSL_SHARED_LOCKS_REQUIRED(mu_) { return releases_ > releases; };
        mu_.Await(absl::Condition(&released));
        --held_;
      }
    }
    if (action) action(path);
    return absl::OkStatus();
  }

 private:
  struct Rule {
    StorageOperation operation;
    std::string path_suffix;
  };
  static bool Matches(const std::optional<Rule>& rule, StorageOperation operation,
                      const std::string& path) {
    return rule.has_value() && rule->operation == operation &&
           absl::EndsWith(path, rule->path_suffix);
  }

  mutable absl::Mutex mu_;
  std::vector<Operation> operations_ ABSL_GUARDED_BY(mu_);
  std::optional<Rule> hold_ ABSL_GUARDED_BY(mu_);
  int64_t releases_ ABSL_GUARDED_BY(mu_) = 0;  // Release() calls so far
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Rule> fail_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::optional<Rule> run_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> action_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::checkpoint::testing

#endif  // ZEROSHARD_CHECKPOINT_TEST_STORAGE_HOOKS_H_
