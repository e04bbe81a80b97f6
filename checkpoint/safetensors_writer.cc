// The safetensors writer: the header JSON built here, the data streamed through a DurableFile
// with running CRC32Cs.
#include "checkpoint/safetensors_writer.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/strict_json.h"
#include "common/dcheck.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

constexpr absl::string_view kMetadataKey = kSafetensorsMetadataKey;
constexpr uint64_t kLengthPrefixBytes = kSafetensorsLengthPrefixBytes;

// The header without padding: "__metadata__" first (when there is any), then the tensors in
// data order.
std::string BuildHeaderJson(const std::vector<TensorDecl>& tensors,
                            const std::vector<uint64_t>& tensor_bytes,
                            const SafetensorsMetadata& metadata) {
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    AppendJsonString(kMetadataKey, &json);
    json.append(":{");
    for (const auto& [key, value] : metadata) {
      if (json.back() != '{') json.push_back(',');
      AppendJsonString(key, &json);
      json.push_back(':');
      AppendJsonString(value, &json);
    }
    json.push_back('}');
    first = false;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!first) json.push_back(',');
    first = false;
    AppendJsonString(tensors[i].name, &json);
    absl::StrAppend(&json, ":{\"dtype\":\"", SafetensorsDTypeName(tensors[i].dtype),
                    "\",\"shape\":[");
    for (size_t d = 0; d < tensors[i].shape.size(); ++d) {
      absl::StrAppend(&json, d == 0 ? "" : ",", tensors[i].shape[d]);
    }
    absl::StrAppend(&json, "],\"data_offsets\":[", offset, ",", offset + tensor_bytes[i], "]}");
    offset += tensor_bytes[i];
  }
  json.push_back('}');
  return json;
}

uint64_t RoundUpTo8(uint64_t n) { return (n + 7) / 8 * 8; }

absl::Status ValidateMetadata(const SafetensorsMetadata& metadata) {
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key)) {
      return absl::InvalidArgumentError("metadata: a key is not valid UTF-8");
    }
    if (!IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata \"", key, "\": the value is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

std::string LengthPrefix(uint64_t header_bytes) {
  std::string prefix(kLengthPrefixBytes, '\0');
  for (uint64_t i = 0; i < kLengthPrefixBytes; ++i) {
    prefix[i] = static_cast<char>((header_bytes >> (8 * i)) & 0xFF);
  }
  return prefix;
}

}  // namespace

absl::StatusOr<SafetensorsHead> EncodeSafetensorsHead(const std::vector<TensorDecl>& tensors,
                                                      const SafetensorsMetadata& metadata) {
  SafetensorsHead head;
  head.tensor_bytes.reserve(tensors.size());
  absl::flat_hash_set<absl::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDecl& tensor = tensors[i];
    const std::string where =
        absl::StrCat("tensors[", i, "] \"", absl::CHexEscape(tensor.name), "\"");
    if (tensor.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "]: empty name"));
    }
    if (tensor.name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the name is reserved"));
    }
    if (!IsValidUtf8(tensor.name)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the name is not valid UTF-8"));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate name"));
    }
    uint64_t bytes = static_cast<uint64_t>(SafetensorsDTypeSize(tensor.dtype));
    for (int64_t dim : tensor.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": negative dimension ", dim));
      }
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": size overflows 64 bits"));
      }
    }
    if (__builtin_add_overflow(head.data_bytes, bytes, &head.data_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": file size overflows 64 bits"));
    }
    head.tensor_bytes.push_back(bytes);
  }
  ZS_RETURN_IF_ERROR(ValidateMetadata(metadata));
  const std::string header = BuildHeaderJson(tensors, head.tensor_bytes, metadata);
  const uint64_t header_bytes = RoundUpTo8(header.size());
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a header of ", header_bytes,
                                                   " bytes exceeds the format's limit of ",
                                                   kMaxSafetensorsHeaderBytes));
  }
  head.bytes = LengthPrefix(header_bytes);
  head.bytes += header;
  head.bytes.resize(kLengthPrefixBytes + header_bytes, ' ');
  return head;
}

// ---- SafetensorsWriter ----

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    std::string path, std::vector<TensorDecl> tensors, SafetensorsMetadata metadata) {
  absl::StatusOr<SafetensorsHead> head = EncodeSafetensorsHead(tensors, metadata);
  if (!head.ok()) {
    return absl::Status(head.status().code(), absl::StrCat(path, ": ", head.status().message()));
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<DurableFile> file, DurableFile::Create(std::move(path)));
  return Start(std::move(file), std::move(tensors), std::move(metadata), *std::move(head));
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const Directory& directory, std::string name, std::vector<TensorDecl> tensors,
    SafetensorsMetadata metadata) {
  absl::StatusOr<SafetensorsHead> head = EncodeSafetensorsHead(tensors, metadata);
  if (!head.ok()) {
    return absl::Status(head.status().code(),
                        absl::StrCat(directory.PathOf(name), ": ", head.status().message()));
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<DurableFile> file,
                      DurableFile::Create(directory, std::move(name)));
  return Start(std::move(file), std::move(tensors), std::move(metadata), *std::move(head));
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Start(
    std::unique_ptr<DurableFile> file, std::vector<TensorDecl> tensors,
    SafetensorsMetadata metadata, SafetensorsHead head) {
  ZS_RETURN_IF_ERROR(file->Append(head.bytes.data(), head.bytes.size()));
  const uint64_t header_bytes = head.bytes.size() - kLengthPrefixBytes;
  return std::unique_ptr<SafetensorsWriter>(
      new SafetensorsWriter(std::move(file), std::move(tensors), std::move(head.tensor_bytes),
                            std::move(metadata), header_bytes, head.data_bytes));
}

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<DurableFile> file,
                                     std::vector<TensorDecl> tensors,
                                     std::vector<uint64_t> tensor_bytes,
                                     SafetensorsMetadata metadata, uint64_t header_bytes,
                                     uint64_t data_bytes)
    : file_(std::move(file)),
      tensors_(std::move(tensors)),
      tensor_bytes_(std::move(tensor_bytes)),
      tensor_crcs_(tensors_.size(), 0),
      metadata_(std::move(metadata)),
      header_bytes_(header_bytes),
      data_bytes_(data_bytes) {
  // Zero-byte tensors at the start are complete before any byte arrives.
  while (current_tensor_ < tensors_.size() && tensor_bytes_[current_tensor_] == 0) {
    ++current_tensor_;
  }
}

absl::Status SafetensorsWriter::Append(const void* data, size_t n) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path(), ": finished"));
  if (n > data_bytes_ - data_written_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path(), ": appending ", n, " bytes at data byte ", data_written_,
                     " overruns the ", data_bytes_, " bytes the tensors declare"));
  }
  ZS_RETURN_IF_ERROR(file_->Append(data, n));
  const auto* bytes = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const uint64_t take =
        std::min<uint64_t>(n, tensor_bytes_[current_tensor_] - current_tensor_written_);
    tensor_crcs_[current_tensor_] = Crc32cExtend(tensor_crcs_[current_tensor_], bytes, take);
    bytes += take;
    n -= take;
    data_written_ += take;
    current_tensor_written_ += take;
    if (current_tensor_written_ == tensor_bytes_[current_tensor_]) {
      data_crc_ =
          Crc32cCombine(data_crc_, tensor_crcs_[current_tensor_], tensor_bytes_[current_tensor_]);
      current_tensor_written_ = 0;
      ++current_tensor_;
      while (current_tensor_ < tensors_.size() && tensor_bytes_[current_tensor_] == 0) {
        ++current_tensor_;
      }
    }
  }
  return absl::OkStatus();
}

uint32_t SafetensorsWriter::tensor_crc32c(size_t index) const {
  ZS_DCHECK(index < current_tensor_)
      << "tensor " << index << " of " << path() << " is not complete";
  return tensor_crcs_[index];
}

absl::Status SafetensorsWriter::SetMetadata(SafetensorsMetadata metadata) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path(), ": finished"));
  ZS_RETURN_IF_ERROR(ValidateMetadata(metadata));
  const std::string header = BuildHeaderJson(tensors_, tensor_bytes_, metadata);
  if (header.size() > header_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path(), ": the new metadata makes the header ", header.size(),
                     " bytes, longer than the ", header_bytes_, " bytes Create() reserved"));
  }
  metadata_ = std::move(metadata);
  return absl::OkStatus();
}

absl::StatusOr<WrittenFile> SafetensorsWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path(), ": finished"));
  if (data_written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path(), ": tensor \"", absl::CHexEscape(tensors_[current_tensor_].name),
                     "\" has ", current_tensor_written_, " of its ", tensor_bytes_[current_tensor_],
                     " bytes; the data lacks ", data_bytes_ - data_written_, " bytes in all"));
  }
  std::string head = LengthPrefix(header_bytes_);
  head += BuildHeaderJson(tensors_, tensor_bytes_, metadata_);
  head.resize(kLengthPrefixBytes + header_bytes_, ' ');
  ZS_RETURN_IF_ERROR(file_->OverwriteAt(0, head.data(), head.size()));
  ZS_RETURN_IF_ERROR(file_->Commit());
  finished_ = true;
  WrittenFile written;
  written.path = path();
  written.bytes = file_->size();
  written.crc32c = Crc32cCombine(Crc32c(head.data(), head.size()), data_crc_, data_bytes_);
  return written;
}

}  // namespace zeroshard::checkpoint
