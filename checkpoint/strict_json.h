// A small strict JSON parser (RFC 8259) for the safetensors header, and the string encoding its
// writer uses. Strict where the official reader (serde_json) is: strict UTF-8, no duplicate
// member names, no trailing text; integers kept exact.
#ifndef ZEROSHARD_CHECKPOINT_STRICT_JSON_H_
#define ZEROSHARD_CHECKPOINT_STRICT_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::checkpoint {

// One parsed JSON value. Plain data: the parser builds it, callers only read it.
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

// "null", "a boolean", "a number", "a string", "an array", "an object": for error messages.
const char* JsonKindName(JsonValue::Kind kind);

// Parses `text` as one JSON value followed by nothing but whitespace. INVALID_ARGUMENT
// ("JSON at byte N: ...") for anything else: a syntax error, a duplicate member name, a string
// that is not strict UTF-8 (or holds an unpaired surrogate escape), or nesting deeper than 64.
// A number is integral (is_integer) when it has no fraction or exponent and fits in int64.
absl::StatusOr<JsonValue> ParseStrictJson(absl::string_view text);

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF (what serde_json, the
// official reader's parser, accepts).
bool IsValidUtf8(absl::string_view text);

// Appends `text` to `out` as a JSON string literal: quotes, escapes for '"', '\\' and control
// characters; other bytes as they are.
void AppendJsonString(absl::string_view text, std::string* out);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_STRICT_JSON_H_
