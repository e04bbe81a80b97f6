// Thread pinning policies of a CPU worker (see thread_placement.h).
#include "worker/daemon/thread_placement.h"

#include <sched.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/thread_affinity.h"

namespace zeroshard::worker {

absl::StatusOr<ThreadPinning> ParseThreadPinning(absl::string_view name) {
  for (ThreadPinning pinning : {ThreadPinning::kNone, ThreadPinning::kTraining,
                                ThreadPinning::kShared, ThreadPinning::kSpread}) {
    if (name == ThreadPinningName(pinning)) return pinning;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("thread_pinning: \"", name, "\" is not none, training, shared or spread"));
}

const char* ThreadPinningName(ThreadPinning pinning) {
  switch (pinning) {
    case ThreadPinning::kNone:
      return "none";
    case ThreadPinning::kTraining:
      return "training";
    case ThreadPinning::kShared:
      return "shared";
    case ThreadPinning::kSpread:
      return "spread";
  }
  return "invalid";
}

ThreadPlacement PlaceThreads(ThreadPinning pinning, int64_t rank, absl::Span<const int> allowed) {
  ThreadPlacement placement;
  if (pinning == ThreadPinning::kNone || allowed.empty()) return placement;
  const int64_t count = static_cast<int64_t>(allowed.size());
  placement.training_cpu = allowed[rank % count];
  if (pinning == ThreadPinning::kShared) placement.comm_cpu = allowed[rank % count];
  if (pinning == ThreadPinning::kSpread) placement.comm_cpu = allowed[(rank + 1) % count];
  return placement;
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status PinCurrentThread(int cpu) {
  if (!common::IsValidCpu(cpu)) {
    return absl::InvalidArgumentError(absl::StrCat("CPU ", cpu, " is out of range"));
  }
  const absl::Status pinned = common::PinCurrentThreadToCpus({cpu});
  if (!pinned.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinning the training thread to CPU ", cpu, ": ", pinned.message()));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::worker
