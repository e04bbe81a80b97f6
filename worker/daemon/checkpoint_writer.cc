// This rank's checkpoints, written from a thread of its own.
#include "worker/daemon/checkpoint_writer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zeroshard::worker {
namespace {

// Bytes handed to the shard writer per call: large enough for the disk, small enough that the
// CRC of a chunk runs from cache.
constexpr size_t kAppendChunkBytes = size_t{4} << 20;
// WriteNow's scratch: the only memory a final checkpoint adds to the process's peak.
constexpr size_t kDirectChunkBytes = size_t{1} << 20;

v1::DType ToFragmentDType(numerics::DType dtype) {
  switch (dtype) {
    case numerics::DType::kFloat32:
      return v1::FLOAT32;
    case numerics::DType::kBFloat16:
      return v1::BFLOAT16;
    case numerics::DType::kFloat16:
      return v1::FLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options, CommitFn commit)
    : options_(std::move(options)), commit_(std::move(commit)), saved_bytes_([this] {
        int64_t bytes = 0;
        for (const engine::Engine::SavedFragment& fragment : options_.fragments) {
          bytes = std::max(bytes, fragment.staging_offset + fragment.bytes());
        }
        return bytes;
      }()) {
  thread_ = std::thread([this] { WriteLoop(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

int64_t CheckpointWriter::staging_bytes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(staging_.capacity());
}

v1::ShardHeader CheckpointWriter::HeaderFor(int64_t step,
                                            const engine::Engine::SavedScalars& scalars) const {
  v1::ShardHeader header = options_.header;
  header.set_step(step);
  header.set_optimizer_step(scalars.optimizer_step);
  header.set_loss_scale(scalars.loss_scale);
  header.set_loss_scale_good_steps(scalars.good_steps);
  header.mutable_tensor_steps()->Assign(scalars.tensor_steps.begin(), scalars.tensor_steps.end());
  return header;
}

absl::Status CheckpointWriter::Save(int64_t step, CopyFn copy) {
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !busy_; };
    mu_.Await(absl::Condition(&idle));
    // Idle: the writer thread does not touch staging_ until busy_ is set below.
    if (staging_.empty()) staging_.resize(saved_bytes_);
  }
  ZS_ASSIGN_OR_RETURN(const engine::Engine::SavedScalars scalars, copy(absl::MakeSpan(staging_)));
  absl::MutexLock lock(&mu_);
  pending_ = HeaderFor(step, scalars);
  busy_ = true;
  return absl::OkStatus();
}

bool CheckpointWriter::Busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

void CheckpointWriter::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !busy_; };
  mu_.Await(absl::Condition(&idle));
}

absl::Status CheckpointWriter::WriteNow(int64_t step, const engine::Engine::SavedScalars& scalars,
                                        CopyFragmentFn copy_fragment) {
  Flush();
  absl::Status copy_error;
  std::vector<char> scratch(kDirectChunkBytes);
  WriteAndCommit(HeaderFor(step, scalars), [&](checkpoint::ShardWriter& writer) -> absl::Status {
    for (size_t i = 0; i < options_.fragments.size(); ++i) {
      const engine::Engine::SavedFragment& fragment = options_.fragments[i];
      const int64_t element_size = numerics::DTypeSize(fragment.dtype);
      const int64_t per_chunk = static_cast<int64_t>(kDirectChunkBytes) / element_size;
      for (int64_t first = 0; first < fragment.end - fragment.begin; first += per_chunk) {
        const int64_t count = std::min(per_chunk, fragment.end - fragment.begin - first);
        const absl::Span<char> chunk(scratch.data(), count * element_size);
        copy_error = copy_fragment(i, first, chunk);
        ZS_RETURN_IF_ERROR(copy_error);
        ZS_RETURN_IF_ERROR(writer.Append(chunk.data(), chunk.size()));
      }
    }
    return absl::OkStatus();
  });
  return copy_error;
}

CheckpointWriterStats CheckpointWriter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CheckpointWriter::WriteLoop() {
  while (true) {
    v1::ShardHeader header;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || busy_; };
      mu_.Await(absl::Condition(&work));
      if (!busy_) return;  // stopping, nothing left
      header = pending_;
    }
    WriteAndCommit(header, [this](checkpoint::ShardWriter& writer) -> absl::Status {
      // SavedFragments are back to back in staging order, as the shard file holds them.
      for (size_t offset = 0; offset < staging_.size(); offset += kAppendChunkBytes) {
        ZS_RETURN_IF_ERROR(writer.Append(staging_.data() + offset,
                                         std::min(kAppendChunkBytes, staging_.size() - offset)));
      }
      return absl::OkStatus();
    });
    // Free only once the commit returned: the ranks take the next checkpoint when every one is
    // free, and then this one is complete (or failed) at the coordinator.
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

void CheckpointWriter::WriteAndCommit(
    const v1::ShardHeader& header,
    absl::FunctionRef<absl::Status(checkpoint::ShardWriter&)> append) {
  const absl::Time start = absl::Now();
  absl::StatusOr<checkpoint::WrittenFile> file = WriteShard(header, append);
  const absl::Duration took = absl::Now() - start;
  if (file.ok()) {
    SendCommit(header.step(), v1::CHECKPOINT_WRITTEN, "", &*file);
  } else {
    ZS_LOG(WARNING) << "checkpoint at step " << header.step() << ": " << file.status();
    SendCommit(header.step(), v1::CHECKPOINT_FAILED, file.status().ToString(), nullptr);
  }
  absl::MutexLock lock(&mu_);
  if (file.ok()) {
    ++stats_.written;
    stats_.bytes_written += static_cast<int64_t>(file->bytes);
    stats_.write_time += took;
  } else {
    ++stats_.failed;
  }
}

absl::StatusOr<checkpoint::WrittenFile> CheckpointWriter::WriteShard(
    const v1::ShardHeader& header,
    absl::FunctionRef<absl::Status(checkpoint::ShardWriter&)> append) {
  std::vector<checkpoint::FragmentSpec> specs;
  specs.reserve(options_.fragments.size());
  for (const engine::Engine::SavedFragment& fragment : options_.fragments) {
    checkpoint::FragmentSpec spec;
    spec.state = fragment.state;
    spec.tensor = header.tensors(static_cast<int>(fragment.tensor)).name();
    spec.begin = fragment.begin;
    spec.end = fragment.end;
    spec.dtype = ToFragmentDType(fragment.dtype);
    specs.push_back(std::move(spec));
  }
  // The step directory, made from the trusted root one component at a time: a link on the way
  // (or in place of the file) is refused, never followed (checkpoint/directory.h).
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory root,
                      checkpoint::Directory::OpenRoot(options_.root));
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory job_dir, root.CreatePath(options_.job_dir));
  ZS_ASSIGN_OR_RETURN(const checkpoint::Directory step_dir,
                      job_dir.CreateChild(checkpoint::StepDirName(header.step())));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardWriter> writer,
                      checkpoint::ShardWriter::Create(
                          step_dir, checkpoint::ShardFileName(header.rank(), header.world_size()),
                          header, std::move(specs)));
  ZS_RETURN_IF_ERROR(append(*writer));
  return writer->Finish();
}

void CheckpointWriter::SendCommit(int64_t step, v1::CheckpointOutcome outcome,
                                  const std::string& message, const checkpoint::WrittenFile* file) {
  v1::CommitCheckpointRequest request = options_.commit_template;
  request.set_step(step);
  request.set_outcome(outcome);
  request.set_message(message.substr(0, 1024));
  if (file != nullptr) {
    request.set_path(
        absl::StrCat(options_.job_dir, "/", checkpoint::StepDirName(step), "/",
                     checkpoint::ShardFileName(request.rank(), options_.header.world_size())));
    request.set_bytes(static_cast<int64_t>(file->bytes));
    request.set_crc32c(file->crc32c);
  }
  if (absl::Status sent = commit_(request); !sent.ok()) {
    ZS_LOG(WARNING) << "checkpoint at step " << step << ": commit failed: " << sent;
  }
}

}  // namespace zeroshard::worker
