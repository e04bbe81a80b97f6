// Export: a committed checkpoint consolidated into one safetensors file of fp32 weights, named and
// shaped as torch names the model's tensors, streamed a bounded piece at a time.
#ifndef ZEROSHARD_CHECKPOINT_EXPORT_H_
#define ZEROSHARD_CHECKPOINT_EXPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/directory.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_file.h"

namespace zeroshard::checkpoint {

// "__metadata__" of an exported file. "format": "pt" is what torch's and transformers' loaders
// look for; the others say where the weights came from.
inline constexpr char kExportFormatKey[] = "format";
inline constexpr char kExportFormat[] = "pt";
inline constexpr char kExportJobIdKey[] = "zeroshard.job_id";
inline constexpr char kExportStepKey[] = "zeroshard.step";
// "final" (the job's state after its last step) or "step <N>".
inline constexpr char kExportSourceKey[] = "zeroshard.source";

// Largest piece Stream() hands its sink at once.
inline constexpr size_t kDefaultExportChunkBytes = size_t{1} << 20;

// The export of one opened checkpoint: which state it reads, the file's head, and a stream of
// its bytes. Values come from "master" (the fp32 masters of bf16/fp16 params) when the
// checkpoint holds it, else from "param" widened to fp32 (exact from bf16 and fp16).
// Thread contract: immutable after Create(); Stream() may run on any number of threads at once.
// The reader must outlive the export.
class CheckpointExport {
 public:
  // Other names of a checkpoint tensor (tied weights: AttachedTensor.aliases), by its name.
  using Aliases = absl::flat_hash_map<std::string, std::vector<std::string>>;

  // Plans the file: one F32 tensor per tensor of the checkpoint's header, with its name and
  // shape, in the header's order, each followed by a copy of its data under each of its
  // `aliases` (safetensors has no aliasing: a strict torch load of a model with tied weights
  // wants every name). `is_final`: the checkpoint is the job's final state (the metadata's
  // source is "final", else "step <step>"). FAILED_PRECONDITION naming the fragment when a
  // fragment of the chosen state is stored in a dtype that does not widen to fp32 exactly
  // (FLOAT64), or naming the states when the checkpoint holds neither "master" nor "param", or
  // naming the tensor when `aliases` names one the checkpoint does not hold; INVALID_ARGUMENT
  // when the head cannot be encoded (EncodeSafetensorsHead: an alias that repeats a name).
  static absl::StatusOr<CheckpointExport> Create(const CheckpointReader* reader, bool is_final,
                                                 const Aliases& aliases = {});

  int64_t step() const { return reader_->header().step(); }
  // kMasterState or kParamState.
  absl::string_view source_state() const { return source_state_; }
  // The file's tensors, in file order (aliases included).
  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // The whole file, head included.
  uint64_t total_bytes() const { return head_.bytes.size() + head_.data_bytes; }

  // Calls `sink` with the file's bytes in order, in pieces of at most `chunk_bytes` (> 0): the
  // head, then each tensor's values. Each fragment is read whole and its CRC32C verified
  // before any of it is converted and passed on (CheckpointReader's reads), so memory is
  // bounded by the largest fragment (at most one tensor) in its stored dtype plus one piece;
  // DATA_LOSS names a corrupt fragment and its file. Returns the first error of `sink` as it
  // is, and stops there.
  absl::Status Stream(const ByteSink& sink, size_t chunk_bytes = kDefaultExportChunkBytes) const;

 private:
  CheckpointExport(const CheckpointReader* reader, std::string source_state,
                   std::vector<TensorDecl> tensors, std::vector<std::string> sources,
                   SafetensorsMetadata metadata, SafetensorsHead head)
      : reader_(reader),
        source_state_(std::move(source_state)),
        tensors_(std::move(tensors)),
        sources_(std::move(sources)),
        metadata_(std::move(metadata)),
        head_(std::move(head)) {}

  // Streams the fp32 values of the checkpoint's tensor `source` (of `tensor`'s shape).
  absl::Status StreamTensor(const TensorDecl& tensor, const std::string& source,
                            const ByteSink& sink, size_t chunk_bytes) const;

  const CheckpointReader* reader_;
  std::string source_state_;
  std::vector<TensorDecl> tensors_;
  // sources_[i]: the checkpoint tensor whose data tensors_[i] holds (its own name, or the
  // tensor it is an alias of).
  std::vector<std::string> sources_;
  SafetensorsMetadata metadata_;
  SafetensorsHead head_;
};

// Streams `plan` into `name` of `directory` durably (DurableFile: the file appears complete
// under its name or not at all; nothing there is followed) and returns its size and CRC32C.
absl::StatusOr<WrittenFile> WriteExportFile(const CheckpointExport& plan,
                                            const Directory& directory, std::string name);
// The same by path: its directory is trusted (DurableFile::Create(final_path)).
absl::StatusOr<WrittenFile> WriteExportFile(const CheckpointExport& plan, const std::string& path);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_EXPORT_H_
