// The coordinator's id formats: jobs are "job-" and workers "worker-" followed by a number of
// at least 6 digits, zero-padded ("job-000042", "worker-000007"). Only canonical forms are ids.
#ifndef ZEROSHARD_COORDINATOR_IDS_H_
#define ZEROSHARD_COORDINATOR_IDS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace zeroshard::coordinator {

inline constexpr absl::string_view kJobIdPrefix = "job-";
inline constexpr absl::string_view kWorkerIdPrefix = "worker-";
// The longest id either format produces is 26 bytes ("worker-" and 19 digits).
inline constexpr size_t kMaxIdLength = 64;

// `number` must be >= 0 (a programmer error otherwise: the process aborts).
std::string FormatJobId(int64_t number);
std::string FormatWorkerId(int64_t number);

// The number of an id in canonical form (what Format*Id returns), or nullopt: "job-42",
// "job-0000042", "job-+00042" and "job-000042 " are not ids.
std::optional<int64_t> ParseJobId(absl::string_view id);
std::optional<int64_t> ParseWorkerId(absl::string_view id);

bool IsValidJobId(absl::string_view id);
bool IsValidWorkerId(absl::string_view id);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_IDS_H_
