// The safetensors container: header JSON built and parsed here (a strict parser that catches
// duplicate names and keeps offsets exact), data streamed through a DurableFile, pread reads.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/crc32c.h"
#include "common/dcheck.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

constexpr absl::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kLengthPrefixBytes = 8;

struct DTypeEntry {
  SafetensorsDType dtype;
  absl::string_view name;
  int size;
};

constexpr DTypeEntry kDTypes[] = {
    {SafetensorsDType::kBool, "BOOL", 1},      {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},          {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},        {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},      {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},        {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},        {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
};

const DTypeEntry& EntryOf(SafetensorsDType dtype) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  ZS_DCHECK(false) << "invalid SafetensorsDType " << static_cast<int>(dtype);
  return kDTypes[0];
}

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF (what serde_json, the
// official reader's parser, accepts).
bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      ++i;
      continue;
    }
    int length;
    unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
    if (byte >= 0xC2 && byte <= 0xDF) {
      length = 2;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      length = 3;
      if (byte == 0xE0) low = 0xA0;
      if (byte == 0xED) high = 0x9F;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      length = 4;
      if (byte == 0xF0) low = 0x90;
      if (byte == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    const auto second = static_cast<unsigned char>(text[i + 1]);
    if (second < low || second > high) return false;
    for (int k = 2; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if (next < 0x80 || next > 0xBF) return false;
    }
    i += length;
  }
  return true;
}

void AppendJsonString(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

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

// ---- A small strict JSON parser (RFC 8259) for headers. ----

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // a string's value, or a number's literal text
  bool is_integer = false;
  int64_t integer = 0;            // when is_integer: the number, exactly
  std::vector<JsonValue> items;   // an array's elements, or an object's member values
  std::vector<std::string> keys;  // an object's member names (parallel to items)
};

const char* KindName(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::kNull:
      return "null";
    case JsonValue::Kind::kBool:
      return "a boolean";
    case JsonValue::Kind::kNumber:
      return "a number";
    case JsonValue::Kind::kString:
      return "a string";
    case JsonValue::Kind::kArray:
      return "an array";
    case JsonValue::Kind::kObject:
      return "an object";
  }
  return "?";
}

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  // One value, then nothing but whitespace.
  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    SkipWhitespace();
    ZS_RETURN_IF_ERROR(ParseValue(&value, 0));
    SkipWhitespace();
    if (at_ != text_.size()) return Error("unexpected text after the value");
    return value;
  }

 private:
  // Far deeper than any header; bounds the recursion on hostile input.
  static constexpr int kMaxDepth = 64;

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON at byte ", at_, ": ", what));
  }

  void SkipWhitespace() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) {
      ++at_;
    }
  }

  bool Consume(absl::string_view literal) {
    if (text_.substr(at_, literal.size()) != literal) return false;
    at_ += literal.size();
    return true;
  }

  absl::Status ParseValue(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    if (at_ >= text_.size()) return Error("unexpected end");
    const char c = text_[at_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      return ParseString(&out->text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (Consume("true") || Consume("false")) {
      out->kind = JsonValue::Kind::kBool;
      out->boolean = c == 't';
      return absl::OkStatus();
    }
    if (Consume("null")) {
      out->kind = JsonValue::Kind::kNull;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", absl::CEscape(text_.substr(at_, 1)), "'"));
  }

  absl::Status ParseObject(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::kObject;
    ++at_;  // '{'
    absl::flat_hash_set<std::string> seen;
    SkipWhitespace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipWhitespace();
      if (at_ >= text_.size() || text_[at_] != '"') return Error("expected a member name");
      std::string key;
      ZS_RETURN_IF_ERROR(ParseString(&key));
      if (!seen.insert(key).second) {
        return Error(absl::StrCat("duplicate name \"", absl::CHexEscape(key), "\""));
      }
      SkipWhitespace();
      if (!Consume(":")) return Error("expected ':'");
      SkipWhitespace();
      JsonValue value;
      ZS_RETURN_IF_ERROR(ParseValue(&value, depth + 1));
      out->keys.push_back(std::move(key));
      out->items.push_back(std::move(value));
      SkipWhitespace();
      if (Consume("}")) return absl::OkStatus();
      if (!Consume(",")) return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::kArray;
    ++at_;  // '['
    SkipWhitespace();
    if (Consume("]")) return absl::OkStatus();
    while (true) {
      SkipWhitespace();
      JsonValue value;
      ZS_RETURN_IF_ERROR(ParseValue(&value, depth + 1));
      out->items.push_back(std::move(value));
      SkipWhitespace();
      if (Consume("]")) return absl::OkStatus();
      if (!Consume(",")) return Error("expected ',' or ']'");
    }
  }

  static void AppendUtf8(uint32_t code_point, std::string* out) {
    if (code_point < 0x80) {
      out->push_back(static_cast<char>(code_point));
    } else if (code_point < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
      out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    } else if (code_point < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (at_ + 4 > text_.size()) return Error("short \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[at_ + i];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else {
        return Error("bad \\u escape");
      }
    }
    at_ += 4;
    *out = value;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++at_;  // '"'
    const size_t start = at_;
    while (true) {
      if (at_ >= text_.size()) return Error("unterminated string");
      const char c = text_[at_];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        ++at_;
        continue;
      }
      ++at_;
      if (at_ >= text_.size()) return Error("unterminated string");
      const char escaped = text_[at_++];
      switch (escaped) {
        case '"':
        case '\\':
        case '/':
          out->push_back(escaped);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t unit = 0;  // Set by ParseHex4; initialized for -Wmaybe-uninitialized.
          ZS_RETURN_IF_ERROR(ParseHex4(&unit));
          if (unit >= 0xDC00 && unit <= 0xDFFF) return Error("unpaired low surrogate");
          if (unit >= 0xD800 && unit <= 0xDBFF) {
            uint32_t low = 0;
            if (!Consume("\\u")) return Error("unpaired high surrogate");
            ZS_RETURN_IF_ERROR(ParseHex4(&low));
            if (low < 0xDC00 || low > 0xDFFF) return Error("unpaired high surrogate");
            unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(unit, out);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
    if (!IsValidUtf8(text_.substr(start, at_ - start))) return Error("string is not UTF-8");
    ++at_;  // '"'
    return absl::OkStatus();
  }

  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = at_;
    auto digits = [&] {
      const size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ - from;
    };
    bool integral = true;
    Consume("-");
    const size_t int_start = at_;
    const size_t int_digits = digits();
    if (int_digits == 0) return Error("bad number");
    if (int_digits > 1 && text_[int_start] == '0') return Error("number with a leading zero");
    if (Consume(".")) {
      integral = false;
      if (digits() == 0) return Error("bad number");
    }
    if (Consume("e") || Consume("E")) {
      integral = false;
      if (!Consume("+")) Consume("-");
      if (digits() == 0) return Error("bad number");
    }
    out->kind = JsonValue::Kind::kNumber;
    out->text = std::string(text_.substr(start, at_ - start));
    out->is_integer = integral && absl::SimpleAtoi(out->text, &out->integer);
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t at_ = 0;
};

// ---- Header validation. ----

// A non-negative integer that fits in int64.
absl::StatusOr<int64_t> NonNegativeInteger(const JsonValue& value, absl::string_view what) {
  if (value.kind != JsonValue::Kind::kNumber || !value.is_integer || value.integer < 0) {
    return absl::DataLossError(absl::StrCat(
        what, ": ", value.kind == JsonValue::Kind::kNumber ? value.text : KindName(value.kind),
        " is not a non-negative 64-bit integer"));
  }
  return value.integer;
}

absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string& name, const JsonValue& entry) {
  const std::string where = absl::StrCat("tensor \"", absl::CHexEscape(name), "\"");
  if (entry.kind != JsonValue::Kind::kObject) {
    return absl::DataLossError(absl::StrCat(where, ": ", KindName(entry.kind), ", not an object"));
  }
  TensorInfo info;
  info.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (size_t i = 0; i < entry.keys.size(); ++i) {
    const std::string& field = entry.keys[i];
    const JsonValue& value = entry.items[i];
    if (field == "dtype") {
      if (value.kind != JsonValue::Kind::kString) {
        return absl::DataLossError(absl::StrCat(where, ": dtype is ", KindName(value.kind)));
      }
      absl::StatusOr<SafetensorsDType> dtype = ParseSafetensorsDType(value.text);
      if (!dtype.ok()) {
        return absl::DataLossError(absl::StrCat(where, ": ", dtype.status().message()));
      }
      info.dtype = *dtype;
      has_dtype = true;
    } else if (field == "shape") {
      if (value.kind != JsonValue::Kind::kArray) {
        return absl::DataLossError(absl::StrCat(where, ": shape is ", KindName(value.kind)));
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

absl::string_view SafetensorsDTypeName(SafetensorsDType dtype) { return EntryOf(dtype).name; }

int SafetensorsDTypeSize(SafetensorsDType dtype) { return EntryOf(dtype).size; }

absl::StatusOr<SafetensorsDType> ParseSafetensorsDType(absl::string_view name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", absl::CHexEscape(name), "\""));
}

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

// ---- SafetensorsReader ----

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

  absl::StatusOr<JsonValue> parsed = JsonParser(header).ParseDocument();
  if (!parsed.ok()) return corrupt(absl::StrCat("header: ", parsed.status().message()));
  if (parsed->kind != JsonValue::Kind::kObject) {
    return corrupt(absl::StrCat("the header is ", KindName(parsed->kind), ", not an object"));
  }
  for (size_t i = 0; i < parsed->keys.size(); ++i) {
    const std::string& key = parsed->keys[i];
    const JsonValue& value = parsed->items[i];
    if (key == kMetadataKey) {
      if (value.kind != JsonValue::Kind::kObject) {
        return corrupt(absl::StrCat("__metadata__ is ", KindName(value.kind), ", not an object"));
      }
      for (size_t m = 0; m < value.keys.size(); ++m) {
        if (value.items[m].kind != JsonValue::Kind::kString) {
          return corrupt(absl::StrCat("__metadata__ \"", absl::CHexEscape(value.keys[m]), "\" is ",
                                      KindName(value.items[m].kind), ", not a string"));
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
