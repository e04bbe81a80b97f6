// Job and worker id formatting and parsing (see the header).
#include "coordinator/ids.h"

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/logging.h"

namespace zeroshard::coordinator {
namespace {

std::string FormatId(absl::string_view prefix, int64_t number) {
  if (number < 0) ZS_LOG(FATAL) << "id numbers are >= 0, got " << number;
  return absl::StrFormat("%s%06d", prefix, number);
}

std::optional<int64_t> ParseId(absl::string_view prefix, absl::string_view id) {
  if (id.size() > kMaxIdLength || !absl::ConsumePrefix(&id, prefix)) return std::nullopt;
  int64_t number = 0;
  if (id.empty() || !absl::c_all_of(id, absl::ascii_isdigit) || !absl::SimpleAtoi(id, &number)) {
    return std::nullopt;
  }
  // Canonical: at least 6 digits, and no zero padding beyond 6.
  if (absl::StrFormat("%06d", number) != id) return std::nullopt;
  return number;
}

}  // namespace

std::string FormatJobId(int64_t number) { return FormatId(kJobIdPrefix, number); }
std::string FormatWorkerId(int64_t number) { return FormatId(kWorkerIdPrefix, number); }

std::optional<int64_t> ParseJobId(absl::string_view id) { return ParseId(kJobIdPrefix, id); }
std::optional<int64_t> ParseWorkerId(absl::string_view id) { return ParseId(kWorkerIdPrefix, id); }

bool IsValidJobId(absl::string_view id) { return ParseJobId(id).has_value(); }
bool IsValidWorkerId(absl::string_view id) { return ParseWorkerId(id).has_value(); }

}  // namespace zeroshard::coordinator
