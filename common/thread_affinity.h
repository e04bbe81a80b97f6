// Pinning the calling thread to CPUs: the one wrapper of pthread_setaffinity_np, shared by the
// Gloo communication thread (worker/comm) and the worker's training thread (worker/daemon).
#ifndef ZEROSHARD_COMMON_THREAD_AFFINITY_H_
#define ZEROSHARD_COMMON_THREAD_AFFINITY_H_

#include <sched.h>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace zeroshard::common {

// CPUs an affinity mask can name are [0, kCpuSetSize).
inline constexpr int kCpuSetSize = CPU_SETSIZE;

inline bool IsValidCpu(int cpu) { return cpu >= 0 && cpu < kCpuSetSize; }

// Restricts the calling thread to `cpus` (pthread_setaffinity_np). INVALID_ARGUMENT for an empty
// list or a CPU outside [0, kCpuSetSize) (its message names the CPU), and for a refused mask
// (its message is the errno text alone, for the caller to say which thread it was).
absl::Status PinCurrentThreadToCpus(absl::Span<const int> cpus);

}  // namespace zeroshard::common

#endif  // ZEROSHARD_COMMON_THREAD_AFFINITY_H_
