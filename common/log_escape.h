// Escaping for log lines: text that came from outside (requests, peers, files) cannot start a line
// of its own or smuggle terminal controls into the log. The logging sink applies it to every
// message.
#ifndef ZEROSHARD_COMMON_LOG_ESCAPE_H_
#define ZEROSHARD_COMMON_LOG_ESCAPE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace zeroshard::common {

// Returns `text` with a backslash doubled, \n \r \t written as those two characters, every other
// ASCII control character (and DEL) as \xNN, and every byte that is not part of valid UTF-8, or
// that encodes a C1 control (U+0080 to U+009F) or a line/paragraph separator (U+2028, U+2029), as
// \xNN per byte. Other UTF-8 text is kept as it is. The result never contains a control byte.
std::string EscapeForLog(absl::string_view text);

// Whether EscapeForLog(text) would return `text` unchanged.
bool IsLogSafe(absl::string_view text);

}  // namespace zeroshard::common

#endif  // ZEROSHARD_COMMON_LOG_ESCAPE_H_
