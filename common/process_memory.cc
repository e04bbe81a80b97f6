// ProcessMemory: /proc/<pid>/status parsing and the VmHWM reset.
#include "common/process_memory.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace zeroshard::common {
namespace {

// The value of a "<key>:  <number> kB" line, in bytes; nullopt when absent or malformed.
std::optional<int64_t> KilobytesField(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return std::nullopt;
    int64_t kilobytes = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kilobytes) || kilobytes < 0) {
      return std::nullopt;
    }
    return kilobytes * 1024;
  }
  return std::nullopt;
}

absl::StatusOr<ProcessMemory> ReadStatusFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseProcessStatus(text.str());
}

}  // namespace

absl::StatusOr<ProcessMemory> ParseProcessStatus(absl::string_view status_text) {
  const std::optional<int64_t> rss = KilobytesField(status_text, "VmRSS");
  const std::optional<int64_t> hwm = KilobytesField(status_text, "VmHWM");
  if (!rss.has_value() || !hwm.has_value()) {
    return absl::InvalidArgumentError("status: no well-formed VmRSS and VmHWM lines");
  }
  return ProcessMemory{*rss, *hwm};
}

absl::StatusOr<ProcessMemory> ReadProcessMemory() { return ReadStatusFile("/proc/self/status"); }

absl::StatusOr<ProcessMemory> ReadProcessMemory(pid_t pid) {
  return ReadStatusFile(absl::StrCat("/proc/", pid, "/status"));
}

absl::Status ResetPeakResidentMemory() {
  std::ofstream out("/proc/self/clear_refs");
  // clear_refs value 5: reset the peak RSS (proc(5)).
  out << "5";
  out.flush();
  if (!out) return absl::UnavailableError("cannot reset VmHWM through /proc/self/clear_refs");
  return absl::OkStatus();
}

}  // namespace zeroshard::common
