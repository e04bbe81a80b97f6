// A process's resident memory as the kernel reports it (/proc/<pid>/status): current and peak
// RSS, for the memory figures a worker reports next to its counted categories.
#ifndef ZEROSHARD_COMMON_PROCESS_MEMORY_H_
#define ZEROSHARD_COMMON_PROCESS_MEMORY_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::common {

struct ProcessMemory {
  int64_t vmrss_bytes = 0;  // VmRSS: resident now
  int64_t vmhwm_bytes = 0;  // VmHWM: the peak of VmRSS (see ResetPeakResidentMemory)
};

// Parses the VmRSS and VmHWM lines ("VmRSS:\t  1234 kB") of a /proc/<pid>/status text.
// InvalidArgument when either is missing or malformed.
absl::StatusOr<ProcessMemory> ParseProcessStatus(absl::string_view status_text);

// This process's figures (/proc/self/status). Unavailable when the file cannot be read (no
// procfs).
absl::StatusOr<ProcessMemory> ReadProcessMemory();
// Process `pid`'s figures (the caller needs the right to read its status, e.g. a child).
absl::StatusOr<ProcessMemory> ReadProcessMemory(pid_t pid);

// Resets this process's VmHWM to its current VmRSS (writes "5" to /proc/self/clear_refs; Linux
// 4.0 and later), so that a later VmHWM is the peak since this call. Unavailable where the kernel
// or the sandbox does not allow it; the peak then stays the process's lifetime peak.
absl::Status ResetPeakResidentMemory();

// Whether this build's RSS follows its allocations: false under AddressSanitizer, whose shadow
// memory and freed-memory quarantine dominate RSS, so tests that compare RSS with counted bytes
// skip there.
constexpr bool RssFollowsAllocations() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return false;
#else
  return true;
#endif
#else
  return true;
#endif
}

}  // namespace zeroshard::common

#endif  // ZEROSHARD_COMMON_PROCESS_MEMORY_H_
