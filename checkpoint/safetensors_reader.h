// Reads the safetensors container (safetensors.h): Open() validates the whole header against
// the file, then reads fetch byte ranges with pread.
#ifndef ZEROSHARD_CHECKPOINT_SAFETENSORS_READER_H_
#define ZEROSHARD_CHECKPOINT_SAFETENSORS_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/directory.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"

namespace zeroshard::checkpoint {

// A tensor of a file, as its header describes it.
struct TensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  // Byte range in the data section (add SafetensorsReader::data_start() for file offsets).
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
  uint64_t num_bytes() const { return data_end - data_begin; }
};

// Reads a safetensors file. Open() checks the whole header against the file (see Open); reads
// then fetch only the byte ranges asked for.
// Thread contract: immutable after Open(); any number of threads may read at once (pread).
class SafetensorsReader {
 public:
  // Opens and validates. Errors (INVALID_ARGUMENT, or DATA_LOSS for a file that the header says
  // is truncated or too long, each naming the file and the tensor or field): a file shorter than
  // 8 bytes; a header length beyond the file or above kMaxSafetensorsHeaderBytes; a header that
  // is not JSON or not an object; a duplicate tensor name; a tensor missing "dtype", "shape" or
  // "data_offsets", with another field, an unknown dtype, a negative or non-integer dimension,
  // or dtype size x elements != end - begin; offsets out of order, overlapping, leaving a gap or
  // out of range; "__metadata__" with a non-string value.
  // The file is a regular file opened for reading (Directory::OpenFile, or a descriptor passed
  // over a socket).
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(File file);
  // The regular file `name` of `directory` (Directory::OpenFile: a link is refused).
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const Directory& directory,
                                                                 absl::string_view name);
  // The same by path: its directory is opened as a trusted root, the file's name not followed.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_size_; }
  // File offset of the data section: 8 + the header length.
  uint64_t data_start() const { return data_start_; }
  // In data order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Null when the file has no tensor of that name.
  const TensorInfo* Find(absl::string_view name) const;
  const SafetensorsMetadata& metadata() const { return metadata_; }

  // Reads bytes [offset, offset + n) of `tensor` (one of tensors()) into `out`.
  // OUT_OF_RANGE when the range leaves the tensor.
  absl::Status ReadTensorBytes(const TensorInfo& tensor, uint64_t offset, void* out,
                               size_t n) const;

 private:
  explicit SafetensorsReader(File file) : file_(std::move(file)) {}

  File file_;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_by_name_;
  SafetensorsMetadata metadata_;
};

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_SAFETENSORS_READER_H_
