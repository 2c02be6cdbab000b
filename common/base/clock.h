// Monotonic time for measuring steps and runs.
#pragma once

#include <chrono>
#include <sstream>
#include <string>

namespace gradsync {

using SteadyClock = std::chrono::steady_clock;

// A duration in seconds as people write it in messages: "30", "0.2", "5.37819" (six significant
// digits, no trailing zeros); the caller adds the unit.
inline std::string SecondsText(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

// Milliseconds of the steady clock, for waits and intervals within one process.
inline double SteadyMs() {
  return std::chrono::duration<double, std::milli>(SteadyClock::now().time_since_epoch()).count();
}

// Microseconds of the steady clock: the time base of traces and of the clock offsets processes
// estimate against the scheduler. Tests give a process a clock of its own by setting
// GRADSYNC_TEST_CLOCK_SKEW_US (microseconds added, read once), as another host's would be.
double TestClockSkewUs();
inline double SteadyMicros() {
  return std::chrono::duration<double, std::micro>(SteadyClock::now().time_since_epoch()).count() + TestClockSkewUs();
}

// A loop's own pauses (SIGSTOP, a process starved of CPU or swapped out): Turn(), once per turn of
// the loop, returns the seconds since the previous turn when that gap exceeds `threshold_s`, else
// 0. A failure detector does not count such a pause against those it waits for: their messages
// wait in its socket, the silence was its own.
class PauseDetector {
 public:
  explicit PauseDetector(double threshold_s) : threshold_s_(threshold_s), last_(SteadyClock::now()) {}
  double Turn() {
    const auto now = SteadyClock::now();
    const double gap = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return gap > threshold_s_ ? gap : 0.0;
  }

 private:
  double threshold_s_;
  SteadyClock::time_point last_;
};

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
