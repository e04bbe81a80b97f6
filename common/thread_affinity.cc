// Pinning the calling thread to CPUs (thread_affinity.h).
#include "common/thread_affinity.h"

#include <pthread.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace zeroshard::common {

absl::Status PinCurrentThreadToCpus(absl::Span<const int> cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("no CPU to pin the thread to");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (!IsValidCpu(cpu)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU ", cpu, " is not in [0, ", kCpuSetSize, ")"));
    }
    CPU_SET(cpu, &set);
  }
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (error != 0) return absl::InvalidArgumentError(std::strerror(error));
  return absl::OkStatus();
}

}  // namespace zeroshard::common
