// The leveled logger behind ZS_LOG.
#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log_escape.h"

namespace zeroshard::common {
namespace {

LogLevel LevelFromEnvironment() {
  const char* env = std::getenv("ZS_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& MinLevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnvironment())};
  return level;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

}  // namespace

void SetMinLogLevel(LogLevel level) { MinLevelStorage().store(static_cast<int>(level)); }

LogLevel MinLogLevel() { return static_cast<LogLevel>(MinLevelStorage().load()); }

namespace logging_internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = "DIWEF";
  stream_ << kLetters[static_cast<int>(level)]
          << absl::FormatTime("%m%d %H:%M:%E6S", absl::Now(), absl::UTCTimeZone()) << ' '
          << Basename(file) << ':' << line << "] ";
  prefix_length_ = static_cast<size_t>(stream_.tellp());
}

LogMessage::~LogMessage() {
  // Messages carry request strings (names, reasons, keys): escaping the whole message here keeps
  // every message on one line, whoever wrote it.
  const std::string text = stream_.str();
  const absl::string_view message = absl::string_view(text).substr(prefix_length_);
  std::string line = text.substr(0, prefix_length_);
  line += EscapeForLog(message);
  line.push_back('\n');
  // One fwrite per message keeps concurrent lines whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
  if (level_ == LogLevel::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace logging_internal
}  // namespace zeroshard::common
