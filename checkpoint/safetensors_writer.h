// Writes the safetensors container (safetensors.h): a streaming writer that never holds the
// file in memory, and the head it writes for producers that stream elsewhere.
#ifndef ZEROSHARD_CHECKPOINT_SAFETENSORS_WRITER_H_
#define ZEROSHARD_CHECKPOINT_SAFETENSORS_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/directory.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"

namespace zeroshard::checkpoint {

// A tensor to write: its bytes are dtype size x product(shape).
struct TensorDecl {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
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

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_SAFETENSORS_WRITER_H_
