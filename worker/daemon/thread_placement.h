// Where a CPU worker's own threads run: the pinning policies a worker may be started with
// (--thread_pinning) and the CPU each gives a rank's training and communication threads.
#ifndef ZEROSHARD_WORKER_DAEMON_THREAD_PLACEMENT_H_
#define ZEROSHARD_WORKER_DAEMON_THREAD_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace zeroshard::worker {

// kNone: the scheduler places every thread. kTraining: only the training thread is pinned, rank
// r's on the r-th allowed CPU (mod their count), so the ranks of a machine train on different
// CPUs. kShared: the training thread as in kTraining, and the communication thread on the same
// CPU. kSpread: the training thread as in kTraining, the communication thread on the next allowed
// CPU (the one the next rank trains on). Gloo's event-loop threads are never pinned.
enum class ThreadPinning { kNone, kTraining, kShared, kSpread };

// "none", "training", "shared" or "spread"; InvalidArgument otherwise.
absl::StatusOr<ThreadPinning> ParseThreadPinning(absl::string_view name);
const char* ThreadPinningName(ThreadPinning pinning);

// The CPU of each thread; unset: not pinned.
struct ThreadPlacement {
  std::optional<int> training_cpu;
  std::optional<int> comm_cpu;
};

// Where `pinning` puts rank `rank`'s threads, given the CPUs the process may use (`allowed`,
// non-empty for any policy but kNone).
ThreadPlacement PlaceThreads(ThreadPinning pinning, int64_t rank, absl::Span<const int> allowed);

// The CPUs the calling thread may run on (sched_getaffinity), ascending; Internal on failure.
absl::StatusOr<std::vector<int>> AllowedCpus();

// Restricts the calling thread to `cpu` (pthread_setaffinity_np); the error names the CPU.
absl::Status PinCurrentThread(int cpu);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_THREAD_PLACEMENT_H_
