#include "common/base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstring>

namespace gradsync {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug") *level = LogLevel::kDebug;
  else if (text == "info") *level = LogLevel::kInfo;
  else if (text == "warning") *level = LogLevel::kWarning;
  else if (text == "error") *level = LogLevel::kError;
  else return false;
  return true;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms));
  const char* base = std::strrchr(file, '/');
  os_ << kLetters[static_cast<int>(level)] << ' ' << buf << ' ' << (base ? base + 1 : file) << ':'
      << line << "] ";
}

LogMessage::~LogMessage() {
  os_ << '\n';
  std::string s = os_.str();
  // One fwrite per line keeps lines from different threads whole.
  std::fwrite(s.data(), 1, s.size(), stderr);
  if (level_ >= LogLevel::kWarning) std::fflush(stderr);
}

}  // namespace internal
}  // namespace gradsync
