// Page tokens of ListWorkers and ListJobs: opaque to clients, they name the last item of the
// previous page, so a listing continues correctly while items come and go between pages.
#ifndef ZEROSHARD_COORDINATOR_PAGE_TOKEN_H_
#define ZEROSHARD_COORDINATOR_PAGE_TOKEN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::coordinator {

// The token continuing a listing after the item with this (job or worker) id.
std::string MakePageToken(absl::string_view last_id);

// The number of the worker a ListWorkers page token continues after. INVALID_ARGUMENT naming
// page_token for anything that no ListWorkers reply made.
absl::StatusOr<int64_t> ParseWorkerPageToken(absl::string_view token);
// The same for ListJobs: the number of the job the token continues after (the next page holds
// older jobs).
absl::StatusOr<int64_t> ParseJobPageToken(absl::string_view token);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_PAGE_TOKEN_H_
