// A small leveled logger (Debian's abseil has no absl/log): ZS_LOG(INFO) << "...";
// Lines go to stderr as "I1129 20:43:29.123456 file.cc:42] message", one line per message: the
// message is escaped with EscapeForLog (common/log_escape.h). Thread-safe.
#ifndef ZEROSHARD_COMMON_LOGGING_H_
#define ZEROSHARD_COMMON_LOGGING_H_

#include <cstddef>
#include <sstream>

namespace zeroshard::common {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Default kInfo; the ZS_LOG_LEVEL environment
// variable (debug, info, warning, error) overrides it at start-up.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

namespace logging_internal {

// Collects one message and writes it, whole and escaped, when destroyed. kFatal aborts afterwards.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
  // Bytes of the "I1129 ... file.cc:42] " prefix at the start of stream_, which is not escaped.
  size_t prefix_length_ = 0;
};

// Swallows the stream expression when the level is disabled.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace zeroshard::common

#define ZS_LOG_LEVEL_DEBUG ::zeroshard::common::LogLevel::kDebug
#define ZS_LOG_LEVEL_INFO ::zeroshard::common::LogLevel::kInfo
#define ZS_LOG_LEVEL_WARNING ::zeroshard::common::LogLevel::kWarning
#define ZS_LOG_LEVEL_ERROR ::zeroshard::common::LogLevel::kError
#define ZS_LOG_LEVEL_FATAL ::zeroshard::common::LogLevel::kFatal

#define ZS_LOG(severity)                                                                         \
  (ZS_LOG_LEVEL_##severity < ::zeroshard::common::MinLogLevel())                                 \
      ? (void)0                                                                                  \
      : ::zeroshard::common::logging_internal::Voidify() &                                       \
            ::zeroshard::common::logging_internal::LogMessage(ZS_LOG_LEVEL_##severity, __FILE__, \
                                                              __LINE__)                          \
                .stream()

#endif  // ZEROSHARD_COMMON_LOGGING_H_
