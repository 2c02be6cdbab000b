// Trace: spans and instant events recorded per thread, written as a Chrome trace-event JSON
// file (loadable in Perfetto and chrome://tracing). Off unless Trace::Start was called: a span
// then costs one relaxed atomic load.
//
// Recording: each thread appends to its own buffer (no lock, no allocation until the buffer is
// full). A full buffer is handed to a writer thread, which appends it to the file while the
// recording thread goes on with a fresh one; Trace::Stop writes what the buffers still hold and
// renames the file into place (until then it is PATH.partial). Stop must run after every
// recording thread has stopped recording (the end of the process's work).
//
// Time: events carry microseconds of the host's steady clock, plus the clock offset, applied when
// they are written. A process learns its offset against the job's scheduler when it registers
// (SchedulerClient::clock(), ClockEstimate::offset_us), so that the traces of every process of a job share the
// scheduler's clock and line up when merged (experiments/trace/trace_merge.h).
//
//   RETURN_IF_ERROR(Trace::Start("trace.json", "worker", 0, scheduler.clock().offset_us()));
//   { TraceSpan s("push", "comm", {{"shard", 1}, {"bytes", 4096}}); ... }  // a complete event ("ph":"X")
//   TraceInstant("rejoin", "failure");                                   // an instant event ("ph":"i")
//   RETURN_IF_ERROR(Trace::Stop());                                      // writes the rest
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/base/cpu_time.h"
#include "common/base/status.h"

namespace gradsync {

// A numeric argument of an event. The name must be a string literal (kept as a pointer).
struct TraceArg {
  const char* name;
  double value;
};

inline constexpr int kMaxTraceArgs = 4;

class Trace {
 public:
  // Begins recording for process `role` `rank` (the file's process name "role rank", its pid
  // `rank`) into `path`. kUnavailable naming the file when it cannot be created; kFailedPrecondition
  // when a trace is being recorded already.
  static Status Start(const std::string& path, const std::string& role, int rank, double clock_offset_us = 0);
  // A better estimate of the clock offset than Start's (a process keeps refining it for as long
  // as it runs), and its error bound (half the round trip it came from; < 0: unknown): written
  // events keep Start's offset, and Stop records the difference and the bound in the file
  // (metadata "clock_correction": us, error_us), which MergeTraces applies and keeps.
  static void RefineClockOffset(double us, double error_us = -1);
  static bool on() { return on_.load(std::memory_order_relaxed); }
  // Microseconds of the steady clock (the offset is added when events are written).
  static double NowUs();
  // Records a finished span [begin_us, begin_us + dur_us). Names and categories must be string
  // literals or otherwise outlive Stop (they are kept as pointers); at most kMaxTraceArgs args.
  static void Complete(const char* name, const char* category, double begin_us, double dur_us,
                       std::initializer_list<TraceArg> args = {});
  static void Complete(const char* name, const char* category, double begin_us, double dur_us, const TraceArg* args,
                       int num_args);
  static void Instant(const char* name, const char* category, std::initializer_list<TraceArg> args = {});
  // Stops recording, writes every thread's remaining events and puts the file in place
  // (kUnavailable naming it when it cannot be written). Returns the number of events written in
  // all through *events. Nothing (OK) when no trace was started.
  static Status Stop(size_t* events = nullptr);

 private:
  static std::atomic<bool> on_;
};

// A complete event from construction to destruction (nothing when tracing is off). Arguments
// known only later (bytes after encoding) are added with Arg.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category, std::initializer_list<TraceArg> args = {})
      : name_(name), category_(category), begin_(Trace::on() ? Trace::NowUs() : -1) {
    if (begin_ >= 0) {
      for (const TraceArg& a : args) Arg(a.name, a.value);
    }
  }
  ~TraceSpan() { End(); }
  // Ends the span now (the destructor then records nothing more): a push ends as it is handed to
  // the transport, before the call that may let the receiver run first.
  void End() {
    if (begin_ >= 0 && Trace::on()) {
      if (cpu_begin_ >= 0) Arg("cpu_us", ThreadCpuMicros() - cpu_begin_);
      Trace::Complete(name_, category_, begin_, Trace::NowUs() - begin_, args_, n_);
    }
    begin_ = -1;
  }
  void Arg(const char* name, double value) {
    if (n_ < kMaxTraceArgs) args_[n_++] = {name, value};
  }
  // The span also says, as `cpu_us`, how much CPU this thread used from now until it ends: its
  // work without the time other threads and processes had the core (what the simulator charges
  // for a traced encode). Nothing when tracing is off.
  void CountCpu() {
    if (begin_ >= 0) cpu_begin_ = ThreadCpuMicros();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  double begin_;
  double cpu_begin_ = -1;
  TraceArg args_[kMaxTraceArgs] = {};
  int n_ = 0;
};

// `s` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string TraceJsonString(const std::string& s);

// Whether a trace file can be created at `path` (its PATH.partial is made and removed): for
// processes that start the trace later, once they know their rank.
Status CheckTraceFile(const std::string& path);

// Stops the trace, writing its file, when it goes out of scope (nothing if Stop ran already):
// a process that fails half-way still leaves a complete file.
class TraceStopper {
 public:
  TraceStopper() = default;
  ~TraceStopper() { (void)Trace::Stop(); }
  TraceStopper(const TraceStopper&) = delete;
  TraceStopper& operator=(const TraceStopper&) = delete;
};

inline void TraceInstant(const char* name, const char* category, std::initializer_list<TraceArg> args = {}) {
  if (Trace::on()) Trace::Instant(name, category, args);
}

}  // namespace gradsync
