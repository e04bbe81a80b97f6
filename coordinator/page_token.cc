// Page tokens: web-safe base64 of the last listed id (see the header).
#include "coordinator/page_token.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "coordinator/ids.h"

namespace zeroshard::coordinator {
namespace {

// Longer than any token made from an id; checked before decoding so a huge token costs nothing.
constexpr size_t kMaxPageTokenBytes = 64;

absl::StatusOr<int64_t> ParsePageToken(absl::string_view token, absl::string_view rpc,
                                       std::optional<int64_t> (*parse_id)(absl::string_view)) {
  const absl::Status bad = absl::InvalidArgumentError(
      absl::StrCat("page_token: not a token from a previous ", rpc, " reply"));
  std::string id;
  if (token.size() > kMaxPageTokenBytes || !absl::WebSafeBase64Unescape(token, &id)) return bad;
  const std::optional<int64_t> number = parse_id(id);
  if (!number.has_value()) return bad;
  return *number;
}

}  // namespace

std::string MakePageToken(absl::string_view last_id) { return absl::WebSafeBase64Escape(last_id); }

absl::StatusOr<int64_t> ParseWorkerPageToken(absl::string_view token) {
  return ParsePageToken(token, "ListWorkers", &ParseWorkerId);
}

absl::StatusOr<int64_t> ParseJobPageToken(absl::string_view token) {
  return ParsePageToken(token, "ListJobs", &ParseJobId);
}

}  // namespace zeroshard::coordinator
