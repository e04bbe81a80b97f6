// The safetensors container (github.com/huggingface/safetensors): a streaming writer that never
// holds the file in memory, and a validating reader that reads byte ranges with pread.
//
// File layout: an unsigned 64-bit little-endian header length N, N bytes of JSON header, then
// the data. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (byte offsets from the start of the data), plus an optional "__metadata__" object of string
// values. Tensors lie back to back in offset order with no gaps, and the header is padded with
// spaces so that the data starts at a multiple of 8 bytes.
#ifndef ZEROSHARD_CHECKPOINT_SAFETENSORS_H_
#define ZEROSHARD_CHECKPOINT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/directory.h"
#include "checkpoint/file_io.h"

namespace zeroshard::checkpoint {

// The element types safetensors names (the byte-sized and wider ones; sub-byte types are not
// supported).
enum class SafetensorsDType {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// "BOOL", "U8", ..., "F32", "BF16", ... as the header spells them.
absl::string_view SafetensorsDTypeName(SafetensorsDType dtype);
// Bytes per element.
int SafetensorsDTypeSize(SafetensorsDType dtype);
// INVALID_ARGUMENT for a name this reader does not know.
absl::StatusOr<SafetensorsDType> ParseSafetensorsDType(absl::string_view name);

// The official reader refuses headers longer than this (bytes).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// "__metadata__": string keys to string values. Ordered, so the header is deterministic.
using SafetensorsMetadata = std::map<std::string, std::string>;

// A tensor to write: its bytes are dtype size x product(shape).
struct TensorDecl {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
};

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

// A complete file: what a manifest records for it.
struct WrittenFile {
  std::string path;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file, header included
};

// What a safetensors file of some declarations starts with, and what follows it.
struct SafetensorsHead {
  // The 8-byte length, the JSON header and its padding: the file's first bytes.
  std::string bytes;
  // Each tensor's data bytes, in declaration order, and their sum (the data section).
  std::vector<uint64_t> tensor_bytes;
  uint64_t data_bytes = 0;
};

// The head SafetensorsWriter::Create writes, for producers that stream a file elsewhere than to
// a local file (an RPC). The same INVALID_ARGUMENT as Create, without the path.
absl::StatusOr<SafetensorsHead> EncodeSafetensorsHead(const std::vector<TensorDecl>& tensors,
                                                      const SafetensorsMetadata& metadata);

// Writes one safetensors file as a stream: the tensors are declared up front, then their bytes
// are appended in declaration order, in chunks of any size (a chunk may end inside a tensor or
// span several). The writer keeps the CRC32C of each tensor and of the whole file as it goes.
// The file is a DurableFile: it appears under its final name only when Finish() succeeds, and
// every I/O error (a full disk included) is a Status naming the path and the errno text.
// Thread contract: not thread-safe; one owner drives it from one thread at a time.
class SafetensorsWriter {
 public:
  // Validates the declarations and writes the header. INVALID_ARGUMENT for an empty, duplicate,
  // non-UTF-8 or "__metadata__" tensor name, a negative dimension, a size overflowing 64 bits,
  // non-UTF-8 metadata, or a header longer than kMaxSafetensorsHeaderBytes.
  // The file is `name` of `directory` (DurableFile::Create: nothing there is followed).
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(const Directory& directory,
                                                                   std::string name,
                                                                   std::vector<TensorDecl> tensors,
                                                                   SafetensorsMetadata metadata);
  // The same by path: its directory is trusted (DurableFile::Create(final_path)).
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(std::string path,
                                                                   std::vector<TensorDecl> tensors,
                                                                   SafetensorsMetadata metadata);

  const std::string& path() const { return file_->final_path(); }
  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  // Bytes of data the declarations call for, and bytes appended so far.
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t data_written() const { return data_written_; }

  // Appends the next `n` bytes of tensor data. FAILED_PRECONDITION past the declared total.
  absl::Status Append(const void* data, size_t n);

  // The CRC32C of tensor `index`'s bytes. REQUIRES: all of its bytes are appended.
  uint32_t tensor_crc32c(size_t index) const;

  // Replaces the metadata that Finish() writes. The header's length was fixed by Create(), so
  // metadata that depends on the data (checksums) must be created with placeholders at least as
  // wide as the final values; the final header is padded with spaces to the same length.
  // FAILED_PRECONDITION when the new header would be longer; INVALID_ARGUMENT for non-UTF-8.
  absl::Status SetMetadata(SafetensorsMetadata metadata);

  // Once every declared byte is appended: writes the final header, then flushes, fsyncs and
  // renames the file into place (DurableFile::Commit). FAILED_PRECONDITION naming the first
  // incomplete tensor when bytes are missing.
  absl::StatusOr<WrittenFile> Finish();

  // Tests simulate a crash between the file's fsync and its rename (DurableFile).
  DurableFile& file_for_testing() { return *file_; }

 private:
  // Writes `head` (of `tensors` and `metadata`) into `file`.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Start(std::unique_ptr<DurableFile> file,
                                                                  std::vector<TensorDecl> tensors,
                                                                  SafetensorsMetadata metadata,
                                                                  SafetensorsHead head);
  SafetensorsWriter(std::unique_ptr<DurableFile> file, std::vector<TensorDecl> tensors,
                    std::vector<uint64_t> tensor_bytes, SafetensorsMetadata metadata,
                    uint64_t header_bytes, uint64_t data_bytes);

  std::unique_ptr<DurableFile> file_;
  std::vector<TensorDecl> tensors_;
  std::vector<uint64_t> tensor_bytes_;
  std::vector<uint32_t> tensor_crcs_;
  SafetensorsMetadata metadata_;
  // N: the header's length as written at Create() (a multiple of 8).
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t data_written_ = 0;
  // Tensor receiving the next byte, and how many of its bytes have arrived.
  size_t current_tensor_ = 0;
  uint64_t current_tensor_written_ = 0;
  // CRC32C of every complete tensor's bytes, back to back.
  uint32_t data_crc_ = 0;
  bool finished_ = false;
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

#endif  // ZEROSHARD_CHECKPOINT_SAFETENSORS_H_
