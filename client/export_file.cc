// Export into a file or a descriptor: the stream's sizes checked against the coordinator's
// announcement, the file made durable only once complete.
#include "client/export_file.h"

#include <unistd.h>

#include <cerrno>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_io.h"
#include "common/status_macros.h"

namespace zeroshard::client {
namespace {

// Takes the file's next bytes.
using ByteWriter = std::function<absl::Status(const std::string& data)>;

// Runs the export stream into `write`, holding the coordinator to the size its first chunk
// announced.
absl::StatusOr<ExportSummary> StreamExport(CoordinatorClient& client, const std::string& job_id,
                                           std::optional<int64_t> step, const ByteWriter& write) {
  ExportSummary summary;
  bool announced = false;
  int64_t received = 0;
  ZS_RETURN_IF_ERROR(client.ExportCheckpoint(
      job_id, step, [&](const v1::ExportCheckpointChunk& chunk) -> absl::Status {
        if (!announced) {
          summary.step = chunk.step();
          summary.final_state = chunk.final_state();
          summary.tensor_count = chunk.tensor_count();
          summary.bytes = chunk.total_bytes();
          announced = true;
        }
        const int64_t size = static_cast<int64_t>(chunk.data().size());
        if (size > summary.bytes - received) {
          return absl::DataLossError(absl::StrCat("export: the coordinator sent more than the ",
                                                  summary.bytes, " bytes it announced"));
        }
        received += size;
        return write(chunk.data());
      }));
  if (!announced) return absl::DataLossError("export: the stream ended without any data");
  if (received != summary.bytes) {
    return absl::DataLossError(absl::StrCat("export: the stream ended after ", received, " of the ",
                                            summary.bytes, " bytes the coordinator announced"));
  }
  return summary;
}

}  // namespace

absl::StatusOr<ExportSummary> ExportToFile(CoordinatorClient& client, const std::string& job_id,
                                           std::optional<int64_t> step, const std::string& path) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::DurableFile> file,
                      checkpoint::DurableFile::Create(path));
  ZS_ASSIGN_OR_RETURN(ExportSummary summary,
                      StreamExport(client, job_id, step, [&](const std::string& data) {
                        return file->Append(data.data(), data.size());
                      }));
  ZS_RETURN_IF_ERROR(file->Commit());
  return summary;
}

absl::StatusOr<ExportSummary> ExportToDescriptor(CoordinatorClient& client,
                                                 const std::string& job_id,
                                                 std::optional<int64_t> step, int fd) {
  return StreamExport(client, job_id, step, [fd](const std::string& data) -> absl::Status {
    size_t written = 0;
    while (written < data.size()) {
      const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return checkpoint::ErrnoError("write", absl::StrCat("file descriptor ", fd), errno);
      }
      written += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  });
}

}  // namespace zeroshard::client
