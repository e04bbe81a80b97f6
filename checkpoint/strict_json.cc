// The strict JSON parser and string encoding of strict_json.h.
#include "checkpoint/strict_json.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

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

}  // namespace

const char* JsonKindName(JsonValue::Kind kind) {
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

absl::StatusOr<JsonValue> ParseStrictJson(absl::string_view text) {
  return JsonParser(text).ParseDocument();
}

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

}  // namespace zeroshard::checkpoint
