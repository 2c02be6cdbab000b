// Monotonic time for measuring steps and runs.
#pragma once

#include <chrono>

namespace gradsync {

using SteadyClock = std::chrono::steady_clock;

// Microseconds of the steady clock: the time base of traces and of the clock offsets processes
// estimate against the scheduler. Tests give a process a clock of its own by setting
// GRADSYNC_TEST_CLOCK_SKEW_US (microseconds added, read once), as another host's would be.
double TestClockSkewUs();
inline double SteadyMicros() {
  return std::chrono::duration<double, std::micro>(SteadyClock::now().time_since_epoch()).count() + TestClockSkewUs();
}

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
