// An ExportCheckpoint stream: the reading thread and the chunk writes.
#include "coordinator/export_stream.h"

#include <algorithm>

#include "checkpoint/checkpoint_reader.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/checkpoint_verification.h"
#include "coordinator/request_parsing.h"

namespace zeroshard::coordinator {

void ExportReactor::Start(std::string job_id, std::optional<int64_t> step) {
  absl::MutexLock lock(&mu_);
  thread_ = std::thread([this, job_id = std::move(job_id), step] {
    const absl::Status status = Read(job_id, step);
    reading_ended_();
    absl::MutexLock lock(&mu_);
    read_status_ = status;
    read_done_ = true;
    FinishIfDoneLocked();
  });
}

void ExportReactor::Refuse(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  read_status_ = status;
  read_done_ = true;
  FinishIfDoneLocked();
}

void ExportReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  queue_.pop_front();
  if (!ok) gone_ = true;
  if (!gone_ && !queue_.empty()) {
    StartWrite(&queue_.front());
    return;
  }
  writing_ = false;
  queue_.clear();
  FinishIfDoneLocked();
}

void ExportReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  gone_ = true;
  FinishIfDoneLocked();
}

void ExportReactor::OnDone() {
  // Nothing reaches this reactor through its handle from now on.
  {
    absl::MutexLock lock(&handle_->mu);
    handle_->reactor = nullptr;
  }
  // Start() assigns thread_ under mu_.
  { absl::MutexLock lock(&mu_); }
  if (thread_.joinable()) thread_.join();
  if (done_) done_();
  delete this;
}

void ExportReactor::Revoke() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  revoked_ = true;
  gone_ = true;
  FinishIfDoneLocked();
}

absl::Status ExportReactor::Read(const std::string& job_id, std::optional<int64_t> step) {
  ZS_ASSIGN_OR_RETURN(ExportSource source, manager_->FindExportCheckpoint(job_id, step));
  // Every file whole against the manifest's size and CRC32C first: a damaged checkpoint
  // exports nothing (DATA_LOSS naming the file), even where its fragments would still read.
  ZS_RETURN_IF_ERROR(FirstDamagedFile(checkpoint::VerifyCheckpoint(source.checkpoint)));
  ZS_ASSIGN_OR_RETURN(const std::unique_ptr<checkpoint::CheckpointReader> reader,
                      checkpoint::CheckpointReader::Open(std::move(source.checkpoint)));
  ZS_ASSIGN_OR_RETURN(
      const checkpoint::CheckpointExport file,
      checkpoint::CheckpointExport::Create(reader.get(), source.is_final, source.aliases));
  v1::ExportCheckpointChunk chunk;
  chunk.set_step(file.step());
  chunk.set_final_state(source.is_final);
  chunk.set_total_bytes(static_cast<int64_t>(file.total_bytes()));
  chunk.set_tensor_count(static_cast<int32_t>(file.tensors().size()));
  chunk.mutable_data()->reserve(kExportChunkBytes);
  ZS_RETURN_IF_ERROR(file.Stream(
      [&](const void* data, size_t n) -> absl::Status {
        const char* bytes = static_cast<const char*>(data);
        while (n > 0) {
          const size_t take = std::min(n, kExportChunkBytes - chunk.data().size());
          chunk.mutable_data()->append(bytes, take);
          bytes += take;
          n -= take;
          if (chunk.data().size() == kExportChunkBytes) {
            ZS_RETURN_IF_ERROR(Push(chunk));
            chunk = v1::ExportCheckpointChunk();
            chunk.mutable_data()->reserve(kExportChunkBytes);
          }
        }
        return absl::OkStatus();
      },
      kExportChunkBytes));
  if (!chunk.data().empty()) ZS_RETURN_IF_ERROR(Push(chunk));
  return absl::OkStatus();
}

absl::Status ExportReactor::Push(const v1::ExportCheckpointChunk& chunk) {
  grpc::ByteBuffer serialized;
  ZS_RETURN_IF_ERROR(SerializeResponse(chunk, &serialized));
  absl::MutexLock lock(&mu_);
  if (!RoomOrGoneLocked() && waits_for_testing_) waits_for_testing_(bytes_queued_);
  mu_.Await(absl::Condition(this, &ExportReactor::RoomOrGoneLocked));
  if (gone_) return absl::CancelledError("export: the client went away");
  bytes_queued_ += static_cast<int64_t>(chunk.data().size());
  queue_.push_back(std::move(serialized));
  if (!writing_) {
    writing_ = true;
    StartWrite(&queue_.front());
  }
  return absl::OkStatus();
}

void ExportReactor::FinishIfDoneLocked() {
  if (finished_ || !read_done_ || writing_) return;
  finished_ = true;
  const absl::Status status =
      revoked_ ? absl::UnauthenticatedError(
                     "export: token revoked: the token (or client certificate) this stream was "
                     "opened with left the coordinator's token file, or now names another "
                     "identity or role, at its reload (SIGHUP); export again with a current "
                     "token")
      : gone_ ? absl::CancelledError("export: the client went away")
              : read_status_;
  metrics_->RecordRpc("ExportCheckpoint", status.code(), absl::Now() - start_);
  Finish(common::ToGrpcStatus(status));
}

}  // namespace zeroshard::coordinator
