// One rank's checkpoint file: the fragments it owns, in W-independent coordinates, in a
// safetensors container whose __metadata__ holds the fragment table and the checkpoint's header.
//
// Each fragment is one 1-D safetensors tensor named FragmentKey(), e.g.
// "exp_avg/0.weight/1024-4096" with shape [3072]. "zeroshard.checkpoint" holds the ShardHeader
// and "zeroshard.fragments" the ShardFragmentTable, each as one JSON string (protobuf's JSON
// mapping, proto field names). Any safetensors reader can open the file.
#ifndef ZEROSHARD_CHECKPOINT_SHARD_FILE_H_
#define ZEROSHARD_CHECKPOINT_SHARD_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/directory.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {

inline constexpr int32_t kShardFormatVersion = 1;
inline constexpr char kShardHeaderMetadataKey[] = "zeroshard.checkpoint";
inline constexpr char kFragmentTableMetadataKey[] = "zeroshard.fragments";
// The parameters as stored (the job's param dtype) and their fp32 masters (bf16/fp16 params).
inline constexpr char kParamState[] = "param";
inline constexpr char kMasterState[] = "master";

// "<state>/<tensor>/<begin>-<end>": the safetensors name of a fragment. Unique within a file
// because state names cannot contain '/' (ValidateStateName).
std::string FragmentKey(absl::string_view state, absl::string_view tensor, int64_t begin,
                        int64_t end);
std::string FragmentKey(const v1::ShardFragment& fragment);

// A state name is 1 to 64 characters of [A-Za-z0-9_.-]. INVALID_ARGUMENT otherwise.
absl::Status ValidateStateName(absl::string_view state);

// Bytes per element of a fragment dtype (FLOAT32, BFLOAT16, FLOAT16, FLOAT64); 0 otherwise.
int FragmentDTypeSize(v1::DType dtype);

// A fragment to write: its table entry before its checksum is known.
struct FragmentSpec {
  std::string state;
  std::string tensor;
  int64_t begin = 0;
  int64_t end = 0;
  v1::DType dtype = v1::FLOAT32;
  int64_t num_elements() const { return end - begin; }
};

// A fragment's spec and its bytes (little-endian elements), for WriteShardFile.
struct FragmentBytes {
  FragmentSpec spec;
  absl::string_view bytes;
};

// Writes one rank's shard file as a stream, in the declared fragment order: Append() takes the
// fragments' bytes in chunks of any size (so the caller can convert or copy out of a staging
// buffer a tile at a time), computing each fragment's CRC32C as they pass; Finish() records the
// checksums in the fragment table and makes the file durable (SafetensorsWriter, DurableFile).
// Any I/O error is a Status naming the path and errno text, and leaves no file behind.
// Thread contract: not thread-safe; one owner (the checkpoint writer thread) drives it.
class ShardWriter {
 public:
  // Validates and writes the header. Sets header.format_version. INVALID_ARGUMENT naming the
  // field: an empty job_id; step, generation, optimizer_step or loss_scale_good_steps < 0;
  // world_size < 1; rank outside [0, world_size); loss_scale not finite and > 0; param_dtype
  // not a fragment dtype; no tensors, or a tensor with an empty or duplicate name or a negative
  // dimension; a state name that is invalid (ValidateStateName) or duplicate. For a fragment
  // (named by its index and key): a state not in header.states, a tensor not in header.tensors,
  // not 0 <= begin < end <= the tensor's elements, an unsupported dtype, or elements
  // overlapping another fragment of the same state and tensor.
  // The file is `name` of `directory` (SafetensorsWriter: nothing there is followed).
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(const Directory& directory,
                                                             std::string name,
                                                             v1::ShardHeader header,
                                                             std::vector<FragmentSpec> fragments);
  // The same by path: its directory is trusted.
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(std::string path,
                                                             v1::ShardHeader header,
                                                             std::vector<FragmentSpec> fragments);

  const std::string& path() const { return file_->path(); }
  const v1::ShardHeader& header() const { return header_; }
  const std::vector<FragmentSpec>& fragments() const { return fragments_; }
  // Bytes of all fragments, and bytes appended so far.
  uint64_t data_bytes() const { return file_->data_bytes(); }
  uint64_t data_written() const { return file_->data_written(); }

  // The next `n` bytes of the fragments' data, in declaration order. A chunk may end inside a
  // fragment or span several. FAILED_PRECONDITION past the declared total.
  absl::Status Append(const void* data, size_t n);

  // Once every fragment's bytes are appended: the file's path, size and CRC32C (what the
  // manifest records). FAILED_PRECONDITION naming the first incomplete fragment otherwise.
  absl::StatusOr<WrittenFile> Finish();

 private:
  // Validates, then creates the container with `open`.
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(
      v1::ShardHeader header, std::vector<FragmentSpec> fragments,
      absl::FunctionRef<absl::StatusOr<std::unique_ptr<SafetensorsWriter>>(std::vector<TensorDecl>,
                                                                           SafetensorsMetadata)>
          open);
  ShardWriter(std::unique_ptr<SafetensorsWriter> file, v1::ShardHeader header,
              std::vector<FragmentSpec> fragments);

  std::unique_ptr<SafetensorsWriter> file_;
  v1::ShardHeader header_;
  std::vector<FragmentSpec> fragments_;
};

// Takes the next chunk of a fragment's bytes.
using ByteSink = std::function<absl::Status(const void* data, size_t n)>;
// Produces the bytes of fragment `index` by calling `sink` with consecutive chunks that together
// hold exactly that fragment's bytes (e.g. copied or converted out of a staging buffer a tile
// at a time), returning the first error of `sink` or its own.
using FragmentProducer = std::function<absl::Status(size_t index, const ByteSink& sink)>;

// Writes a shard file with ShardWriter, calling `produce` once per fragment in declaration
// order. INVALID_ARGUMENT naming the fragment when `produce` gives it more or fewer bytes than
// it holds; an error `produce` returns is returned as it is. No file is left behind on error.
absl::StatusOr<WrittenFile> WriteShardFile(std::string path, v1::ShardHeader header,
                                           std::vector<FragmentSpec> fragments,
                                           const FragmentProducer& produce);

// The same for fragments held in memory: `bytes` must hold exactly each fragment's elements.
absl::StatusOr<WrittenFile> WriteShardFile(std::string path, v1::ShardHeader header,
                                           absl::Span<const FragmentBytes> fragments);

// Reads one rank's shard file. Open() reads and checks the header and fragment table (not the
// data); reads fetch only the fragments asked for, and verify each fragment's CRC32C.
// Thread contract: immutable after Open(); any number of threads may read at once.
class ShardReader {
 public:
  // Opens the container (SafetensorsReader::Open's checks) and checks the table against it.
  // DATA_LOSS naming the file and the field or fragment: a missing or unparsable
  // "zeroshard.checkpoint" or "zeroshard.fragments"; a header or fragment ShardWriter::Create
  // would refuse; a fragment without its safetensors tensor, or whose tensor has another dtype
  // or a shape other than [end - begin]; a safetensors tensor that is no fragment.
  // FAILED_PRECONDITION for a format_version other than kShardFormatVersion.
  // The regular file `name` of `directory` (Directory::OpenFile: a link is refused).
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const Directory& directory,
                                                           absl::string_view name);
  // The same by path: its directory is trusted, the file's name not followed.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->file_size(); }
  const v1::ShardHeader& header() const { return header_; }
  // In data order.
  const std::vector<v1::ShardFragment>& fragments() const { return fragments_; }

  // Reads elements [begin, end) of fragments()[index], which must lie within the fragment, into
  // `out` (out_bytes == (end - begin) x the dtype's size). To verify the fragment's CRC32C it
  // reads the WHOLE fragment, whatever part is asked for: a reader needing a small part of a
  // large fragment still pays for all of it (the part goes straight into `out`, the rest through
  // a bounded scratch buffer). DATA_LOSS naming the file, the fragment and both checksums on a
  // mismatch; `out` then holds unspecified bytes. INVALID_ARGUMENT for a bad index or range.
  absl::Status ReadFragmentRange(size_t index, int64_t begin, int64_t end, void* out,
                                 size_t out_bytes) const;
  // All of fragments()[index].
  absl::Status ReadFragment(size_t index, void* out, size_t out_bytes) const;

 private:
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(std::unique_ptr<SafetensorsReader> file);
  ShardReader(std::unique_ptr<SafetensorsReader> file, v1::ShardHeader header,
              std::vector<v1::ShardFragment> fragments, std::vector<const TensorInfo*> tensors);

  std::unique_ptr<SafetensorsReader> file_;
  v1::ShardHeader header_;
  std::vector<v1::ShardFragment> fragments_;
  // tensors_[i]: fragments_[i]'s safetensors tensor (owned by file_).
  std::vector<const TensorInfo*> tensors_;
};

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_SHARD_FILE_H_
