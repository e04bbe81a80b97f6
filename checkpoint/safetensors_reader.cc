// The safetensors reader: the header parsed by the strict JSON parser and checked against the
// file (names, dtypes, shapes, offsets), then pread reads of byte ranges.
#include "checkpoint/safetensors_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/strict_json.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

constexpr absl::string_view kMetadataKey = kSafetensorsMetadataKey;
constexpr uint64_t kLengthPrefixBytes = kSafetensorsLengthPrefixBytes;

// A non-negative integer that fits in int64.
absl::StatusOr<int64_t> NonNegativeInteger(const JsonValue& value, absl::string_view what) {
  if (value.kind != JsonValue::Kind::kNumber || !value.is_integer || value.integer < 0) {
    return absl::DataLossError(absl::StrCat(
        what, ": ", value.kind == JsonValue::Kind::kNumber ? value.text : JsonKindName(value.kind),
        " is not a non-negative 64-bit integer"));
  }
  return value.integer;
}

absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string& name, const JsonValue& entry) {
  const std::string where = absl::StrCat("tensor \"", absl::CHexEscape(name), "\"");
  if (entry.kind != JsonValue::Kind::kObject) {
    return absl::DataLossError(
        absl::StrCat(where, ": ", JsonKindName(entry.kind), ", not an object"));
  }
  TensorInfo info;
  info.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (size_t i = 0; i < entry.keys.size(); ++i) {
    const std::string& field = entry.keys[i];
    const JsonValue& value = entry.items[i];
    if (field == "dtype") {
      if (value.kind != JsonValue::Kind::kString) {
        return absl::DataLossError(absl::StrCat(where, ": dtype is ", JsonKindName(value.kind)));
      }
      absl::StatusOr<SafetensorsDType> dtype = ParseSafetensorsDType(value.text);
      if (!dtype.ok()) {
        return absl::DataLossError(absl::StrCat(where, ": ", dtype.status().message()));
      }
      info.dtype = *dtype;
      has_dtype = true;
    } else if (field == "shape") {
      if (value.kind != JsonValue::Kind::kArray) {
        return absl::DataLossError(absl::StrCat(where, ": shape is ", JsonKindName(value.kind)));
      }
      for (size_t d = 0; d < value.items.size(); ++d) {
        ZS_ASSIGN_OR_RETURN(
            const int64_t dim,
            NonNegativeInteger(value.items[d], absl::StrCat(where, ": shape[", d, "]")));
        info.shape.push_back(dim);
      }
      has_shape = true;
    } else if (field == "data_offsets") {
      if (value.kind != JsonValue::Kind::kArray || value.items.size() != 2) {
        return absl::DataLossError(
            absl::StrCat(where, ": data_offsets is not an array of two integers"));
      }
      ZS_ASSIGN_OR_RETURN(
          const int64_t begin,
          NonNegativeInteger(value.items[0], absl::StrCat(where, ": data_offsets[0]")));
      ZS_ASSIGN_OR_RETURN(
          const int64_t end,
          NonNegativeInteger(value.items[1], absl::StrCat(where, ": data_offsets[1]")));
      if (end < begin) {
        return absl::DataLossError(
            absl::StrCat(where, ": data_offsets [", begin, ", ", end, "] end before they begin"));
      }
      info.data_begin = static_cast<uint64_t>(begin);
      info.data_end = static_cast<uint64_t>(end);
      has_offsets = true;
    } else {
      return absl::DataLossError(
          absl::StrCat(where, ": unknown field \"", absl::CHexEscape(field), "\""));
    }
  }
  if (!has_dtype) return absl::DataLossError(absl::StrCat(where, ": no dtype"));
  if (!has_shape) return absl::DataLossError(absl::StrCat(where, ": no shape"));
  if (!has_offsets) return absl::DataLossError(absl::StrCat(where, ": no data_offsets"));
  uint64_t bytes = static_cast<uint64_t>(SafetensorsDTypeSize(info.dtype));
  for (int64_t dim : info.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
      return absl::DataLossError(absl::StrCat(where, ": shape overflows 64 bits"));
    }
  }
  if (bytes != info.num_bytes()) {
    return absl::DataLossError(absl::StrCat(where, ": dtype ", SafetensorsDTypeName(info.dtype),
                                            " x shape [", absl::StrJoin(info.shape, ","), "] is ",
                                            bytes, " bytes, but data_offsets [", info.data_begin,
                                            ", ", info.data_end, "] hold ", info.num_bytes()));
  }
  return info;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  const size_t slash = path.rfind('/');
  ZS_ASSIGN_OR_RETURN(const Directory directory, Directory::OpenRoot(DirectoryOf(path)));
  return Open(directory, slash == std::string::npos ? path : path.substr(slash + 1));
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const Directory& directory, absl::string_view name) {
  ZS_ASSIGN_OR_RETURN(File file, directory.OpenFile(name));
  return Open(std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(File file) {
  const std::string path = file.path();
  const int fd = file.fd();
  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader(std::move(file)));
  ZS_ASSIGN_OR_RETURN(reader->file_size_, reader->file_.Size());
  auto corrupt = [&path](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("safetensors file ", path, ": ", what));
  };
  if (reader->file_size_ < kLengthPrefixBytes) {
    return corrupt(absl::StrCat("the file has ", reader->file_size_,
                                " bytes, fewer than the 8-byte header length"));
  }
  unsigned char prefix[kLengthPrefixBytes];
  ZS_RETURN_IF_ERROR(PreadFully(fd, path, 0, prefix, sizeof(prefix)));
  uint64_t header_bytes = 0;
  for (int i = kLengthPrefixBytes - 1; i >= 0; --i) header_bytes = (header_bytes << 8) | prefix[i];
  if (header_bytes > reader->file_size_ - kLengthPrefixBytes) {
    return corrupt(absl::StrCat("the header length ", header_bytes, " reaches beyond the file (",
                                reader->file_size_, " bytes): truncated or not safetensors"));
  }
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return corrupt(absl::StrCat("the header length ", header_bytes,
                                " exceeds the format's limit of ", kMaxSafetensorsHeaderBytes));
  }
  std::string header(header_bytes, '\0');
  ZS_RETURN_IF_ERROR(PreadFully(fd, path, kLengthPrefixBytes, header.data(), header.size()));
  reader->data_start_ = kLengthPrefixBytes + header_bytes;
  const uint64_t data_size = reader->file_size_ - reader->data_start_;

  absl::StatusOr<JsonValue> parsed = ParseStrictJson(header);
  if (!parsed.ok()) return corrupt(absl::StrCat("header: ", parsed.status().message()));
  if (parsed->kind != JsonValue::Kind::kObject) {
    return corrupt(absl::StrCat("the header is ", JsonKindName(parsed->kind), ", not an object"));
  }
  for (size_t i = 0; i < parsed->keys.size(); ++i) {
    const std::string& key = parsed->keys[i];
    const JsonValue& value = parsed->items[i];
    if (key == kMetadataKey) {
      if (value.kind != JsonValue::Kind::kObject) {
        return corrupt(
            absl::StrCat("__metadata__ is ", JsonKindName(value.kind), ", not an object"));
      }
      for (size_t m = 0; m < value.keys.size(); ++m) {
        if (value.items[m].kind != JsonValue::Kind::kString) {
          return corrupt(absl::StrCat("__metadata__ \"", absl::CHexEscape(value.keys[m]), "\" is ",
                                      JsonKindName(value.items[m].kind), ", not a string"));
        }
        reader->metadata_.emplace(value.keys[m], value.items[m].text);
      }
      continue;
    }
    absl::StatusOr<TensorInfo> tensor = ParseTensorEntry(key, value);
    if (!tensor.ok()) return corrupt(tensor.status().message());
    reader->tensors_.push_back(*std::move(tensor));
  }
  std::stable_sort(reader->tensors_.begin(), reader->tensors_.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.data_begin != b.data_begin ? a.data_begin < b.data_begin
                                                         : a.data_end < b.data_end;
                   });
  uint64_t expected = 0;
  for (size_t i = 0; i < reader->tensors_.size(); ++i) {
    const TensorInfo& tensor = reader->tensors_[i];
    const std::string where =
        absl::StrCat("tensor \"", absl::CHexEscape(tensor.name), "\" (data_offsets [",
                     tensor.data_begin, ", ", tensor.data_end, "])");
    if (tensor.data_begin < expected) {
      return corrupt(absl::StrCat(where, " overlaps tensor \"",
                                  absl::CHexEscape(reader->tensors_[i - 1].name),
                                  "\", which ends at ", expected));
    }
    if (tensor.data_begin > expected) {
      return corrupt(absl::StrCat(where, " leaves a gap of ", tensor.data_begin - expected,
                                  " bytes before it"));
    }
    if (tensor.data_end > data_size) {
      return corrupt(absl::StrCat(where, " ends beyond the data section, which holds ", data_size,
                                  " bytes (file size ", reader->file_size_, "): truncated"));
    }
    expected = tensor.data_end;
    reader->index_by_name_.emplace(tensor.name, i);
  }
  if (expected != data_size) {
    return corrupt(absl::StrCat("the tensors cover ", expected,
                                " bytes of data, but the file holds ", data_size,
                                " after its header"));
  }
  return reader;
}

const TensorInfo* SafetensorsReader::Find(absl::string_view name) const {
  const auto it = index_by_name_.find(name);
  return it == index_by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsReader::ReadTensorBytes(const TensorInfo& tensor, uint64_t offset,
                                                void* out, size_t n) const {
  if (offset > tensor.num_bytes() || n > tensor.num_bytes() - offset) {
    return absl::OutOfRangeError(absl::StrCat(path(), ": bytes [", offset, ", ", offset + n,
                                              ") of tensor \"", absl::CHexEscape(tensor.name),
                                              "\", which has ", tensor.num_bytes()));
  }
  return PreadFully(file_.fd(), path(), data_start_ + tensor.data_begin + offset, out, n);
}

}  // namespace zeroshard::checkpoint
