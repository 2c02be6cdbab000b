// Monotonic time for measuring steps and runs.
#pragma once

#include <chrono>

namespace gradsync {

using SteadyClock = std::chrono::steady_clock;

class Stopwatch {
 public:
  Stopwatch() : start_(SteadyClock::now()) {}
  void Reset() { start_ = SteadyClock::now(); }
  double Seconds() const { return std::chrono::duration<double>(SteadyClock::now() - start_).count(); }
  double Millis() const { return Seconds() * 1e3; }

 private:
  SteadyClock::time_point start_;
};

}  // namespace gradsync
