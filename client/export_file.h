// `zeroshard export`'s work: a checkpoint export streamed from the coordinator into a file that
// appears only once complete, or into an open descriptor (stdout).
#ifndef ZEROSHARD_CLIENT_EXPORT_FILE_H_
#define ZEROSHARD_CLIENT_EXPORT_FILE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace zeroshard::client {

// What an export wrote, from the stream's first chunk.
struct ExportSummary {
  int64_t step = 0;
  // The checkpoint is the job's final state.
  bool final_state = false;
  int32_t tensor_count = 0;
  int64_t bytes = 0;
};

// Streams the export of `job_id`'s checkpoint at `step` (without one, its final checkpoint) into
// `path` through a temporary file in the same directory that is fsynced and renamed into place
// once every byte the coordinator announced has arrived: a failed export leaves no file and an
// existing `path` untouched. The coordinator's errors as they are; DATA_LOSS when the stream ends
// short of or beyond its announced size; errno statuses naming the path.
absl::StatusOr<ExportSummary> ExportToFile(CoordinatorClient& client, const std::string& job_id,
                                           std::optional<int64_t> step, const std::string& path);

// The same into the open descriptor `fd` (e.g. stdout), written as the chunks arrive: a failed
// export leaves the bytes written so far, so the caller must report the failure.
absl::StatusOr<ExportSummary> ExportToDescriptor(CoordinatorClient& client,
                                                 const std::string& job_id,
                                                 std::optional<int64_t> step, int fd);

}  // namespace zeroshard::client

#endif  // ZEROSHARD_CLIENT_EXPORT_FILE_H_
