// Work handles that are finished when they are returned.
#include "worker/comm/communicator.h"

#include <utility>

namespace zeroshard::comm {
namespace {

// Immutable after construction, so thread-safe.
class FinishedWork : public Work {
 public:
  explicit FinishedWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait(absl::Duration /*timeout*/) override { return status_; }
  bool Done() const override { return true; }
  std::optional<absl::Duration> RunTime() const override { return absl::ZeroDuration(); }

 private:
  const absl::Status status_;
};

}  // namespace

std::unique_ptr<Work> MakeFinishedWork(absl::Status status) {
  return std::make_unique<FinishedWork>(std::move(status));
}

}  // namespace zeroshard::comm
