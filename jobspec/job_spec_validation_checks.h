// Field checks shared by ValidateJobSpec and the coordinator's request validation: each returns
// OK or INVALID_ARGUMENT with a message that starts with the field's path ("optimizer.lr: ...").
#ifndef ZEROSHARD_JOBSPEC_JOB_SPEC_VALIDATION_CHECKS_H_
#define ZEROSHARD_JOBSPEC_JOB_SPEC_VALIDATION_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/descriptor.h"

namespace zeroshard::jobspec {

// Names (job names, worker names) are 1 to this many characters of [a-z0-9-].
inline constexpr size_t kMaxNameLength = 63;

// A double as messages show it: "NaN", "Inf", "-Inf", integers in plain digits, anything else
// in the shortest form that reads back to the same value ("-0.1", "1e-08").
std::string FormatDouble(double value);

// A string as messages show it: C-escaped in double quotes, cut to its first 64 bytes (then
// "..." and the whole length, as `"xxx"... (1000 bytes)`) so that an oversized input is not
// echoed back whole.
std::string Quote(absl::string_view value);

// Whether an end of a range belongs to it.
enum class Bound { kClosed, kOpen };

// `value` must be finite (NaN and ±Inf are named as such) and within the range from `low` to
// `high`, each end closed or open; the message shows the range as "(0, 10]".
absl::Status CheckDoubleInRange(absl::string_view field, double value, double low, Bound low_bound,
                                double high, Bound high_bound);

// `value` must be finite and >= 0 (times, byte counts).
absl::Status CheckFiniteNonNegative(absl::string_view field, double value);

// `value` must be finite (any sign).
absl::Status CheckFinite(absl::string_view field, double value);

// `value` must be within [low, high].
absl::Status CheckIntInRange(absl::string_view field, int64_t value, int64_t low, int64_t high);

// `value` must be 1 to kMaxNameLength characters of [a-z0-9-].
absl::Status CheckName(absl::string_view field, absl::string_view value);

// `value` (a number of the enum `type`; proto3 enum fields hold any int) must be one of
// `allowed`. An unknown number, the zero value when it is not allowed ("required") and a known
// but unsupported value each get their own message, which lists the allowed names.
absl::Status CheckEnumIn(absl::string_view field, const google::protobuf::EnumDescriptor& type,
                         int value, absl::Span<const int> allowed);

// `value` must be at most `max_bytes` bytes long.
absl::Status CheckMaxBytes(absl::string_view field, absl::string_view value, size_t max_bytes);

}  // namespace zeroshard::jobspec

#endif  // ZEROSHARD_JOBSPEC_JOB_SPEC_VALIDATION_CHECKS_H_
