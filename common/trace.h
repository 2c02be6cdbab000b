// Trace: spans and instant events recorded per thread, written as a Chrome trace-event JSON
// file (loadable in Perfetto and chrome://tracing). Off unless Trace::Start was called: a span
// then costs one relaxed atomic load.
//
// Recording: each thread appends to its own buffer (no lock, no allocation once the buffer has
// grown); the buffers are registered once per thread and read by Trace::Stop, which must run
// after every recording thread has stopped recording (the end of the process's work). Events
// carry their start in microseconds of a steady clock since Trace::Start plus `clock_offset_us`
// (an offset a process may learn against a common reference, so that the traces of several
// processes line up), their duration, a name, a category and up to two numeric arguments.
//
//   Trace::Start("worker", 0);
//   { TraceSpan s("backward", "compute"); ... }           // a complete event ("ph":"X")
//   TraceInstant("rejoin", "failure");                      // an instant event ("ph":"i")
//   RETURN_IF_ERROR(Trace::Stop("trace.json"));             // writes the file
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace gradsync {

class Trace {
 public:
  // Begins recording for process `role` `rank` (the file's process name "role rank").
  static void Start(const std::string& role, int rank, double clock_offset_us = 0);
  static bool on() { return on_.load(std::memory_order_relaxed); }
  // Microseconds since Start, plus the offset.
  static double NowUs();
  // Records a finished span [begin_us, begin_us + dur_us). Names and categories must be string
  // literals or otherwise outlive Stop (they are kept as pointers).
  static void Complete(const char* name, const char* category, double begin_us, double dur_us,
                       const char* arg_name = nullptr, double arg = 0, const char* arg2_name = nullptr,
                       double arg2 = 0);
  static void Instant(const char* name, const char* category, const char* arg_name = nullptr, double arg = 0);
  // Stops recording and writes every thread's events to `path` (kUnavailable naming the file
  // when it cannot be written). Returns the number of events written through *events.
  static Status Stop(const std::string& path, size_t* events = nullptr);

 private:
  static std::atomic<bool> on_;
};

// A complete event from construction to destruction (nothing when tracing is off).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category, const char* arg_name = nullptr, double arg = 0)
      : name_(name), category_(category), arg_name_(arg_name), arg_(arg), begin_(Trace::on() ? Trace::NowUs() : -1) {}
  ~TraceSpan() {
    if (begin_ >= 0 && Trace::on()) Trace::Complete(name_, category_, begin_, Trace::NowUs() - begin_, arg_name_, arg_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  const char* arg_name_;
  double arg_;
  double begin_;
};

inline void TraceInstant(const char* name, const char* category, const char* arg_name = nullptr, double arg = 0) {
  if (Trace::on()) Trace::Instant(name, category, arg_name, arg);
}

}  // namespace gradsync
