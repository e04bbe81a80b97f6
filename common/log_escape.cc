// Escaping of log message text (see the header).
#include "common/log_escape.h"

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace zeroshard::common {
namespace {

// Length of the valid UTF-8 sequence at text[i] (2 to 4), or 0 when there is none. Overlong forms
// and surrogates are not valid.
size_t Utf8SequenceLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  size_t length = 0;
  uint32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  const bool overlong =
      (length == 3 && code_point < 0x800) || (length == 4 && code_point < 0x10000);
  const bool surrogate = code_point >= 0xD800 && code_point <= 0xDFFF;
  // C1 controls and the Unicode line breaks act as controls in terminals and log viewers.
  const bool control =
      (code_point >= 0x80 && code_point <= 0x9F) || code_point == 0x2028 || code_point == 0x2029;
  if (overlong || surrogate || code_point > 0x10FFFF || control) return 0;
  return length;
}

bool IsPlainAscii(char c) { return c >= 0x20 && c < 0x7F && c != '\\'; }

}  // namespace

bool IsLogSafe(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (IsPlainAscii(text[i])) {
      ++i;
      continue;
    }
    const size_t length = Utf8SequenceLength(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string EscapeForLog(absl::string_view text) {
  if (IsLogSafe(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (IsPlainAscii(c)) {
      out.push_back(c);
      ++i;
      continue;
    }
    if (const size_t length = Utf8SequenceLength(text, i); length > 0) {
      out.append(text.data() + i, length);
      i += length;
      continue;
    }
    switch (c) {
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      default:
        absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(c));
    }
    ++i;
  }
  return out;
}

}  // namespace zeroshard::common
