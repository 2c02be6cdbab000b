// Minimal leveled logging to stderr: one line per message, safe to call from any thread.
//
//   GRADSYNC_LOG(INFO) << "epoch " << e << " done";
//
// Lines look like "I 12:03:04.567 trainer.cc:88] epoch 3 done". The threshold is
// SetLogLevel() or the GRADSYNC_LOG_LEVEL environment variable (debug|info|warning|error),
// read once by the binaries' flag parser; library code never reads the environment.
#pragma once

#include <sstream>
#include <string_view>

namespace gradsync {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses debug|info|warning|error; returns false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace gradsync

#define GRADSYNC_LOG_LEVEL_DEBUG ::gradsync::LogLevel::kDebug
#define GRADSYNC_LOG_LEVEL_INFO ::gradsync::LogLevel::kInfo
#define GRADSYNC_LOG_LEVEL_WARNING ::gradsync::LogLevel::kWarning
#define GRADSYNC_LOG_LEVEL_ERROR ::gradsync::LogLevel::kError

#define GRADSYNC_LOG(severity)                                                   \
  (GRADSYNC_LOG_LEVEL_##severity < ::gradsync::GetLogLevel())                    \
      ? (void)0                                                                  \
      : ::gradsync::internal::LogVoidify() &                                     \
            ::gradsync::internal::LogMessage(GRADSYNC_LOG_LEVEL_##severity, __FILE__, \
                                             __LINE__)                           \
                .stream()
