// The traces of a job's processes (common/obs/trace.h) merged into one timeline, and that timeline
// drawn: gradsync-launch --trace and gradsync-run's `trace: true` write each process's file under
// OUT/traces/, merge them into OUT/trace.json (one process track per node, named by role and
// rank, in the order scheduler, servers, workers; time in microseconds from the job's first
// event, on the scheduler's clock) and gradsync-run draws timeline-<run>.png from it.
//
//   ASSIGN_OR_RETURN(MergeStats m, MergeTraces({"traces/scheduler.json", "traces/server-0.json"}, "trace.json"));
//   ASSIGN_OR_RETURN(LoadedTrace t, LoadTrace("trace.json"));
//   RETURN_IF_ERROR(DrawTimeline(t, "timeline.png", 4));
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

struct TraceEvent {
  std::string name;
  std::string category;
  int process = 0;    // index into LoadedTrace::processes
  int thread = 0;
  bool instant = false;
  double ts_us = 0;   // start
  double dur_us = 0;  // 0 for an instant
  std::map<std::string, double> args;

  double end_us() const { return ts_us + dur_us; }
  // The argument `key`, or `missing`.
  double Arg(const std::string& key, double missing = -1) const;
};

struct LoadedTrace {
  std::vector<std::string> processes;  // "scheduler 0", "server 1", "worker 3": by pid
  // Per process: the bound on its clock offset's error (half the best round trip to the
  // scheduler), in microseconds; -1 when the file does not say (the scheduler's own: 0).
  std::vector<double> clock_error_us;
  std::vector<TraceEvent> events;      // in file order

  // The index of process `name`, or -1.
  int Process(const std::string& name) const;
};

// Reads a trace-event JSON file as Trace and MergeTraces write it: one event object per line
// (processes named by their process_name metadata, each process's clock_correction applied).
// kNotFound when it does not exist; kDataLoss, naming the file and line, when it is not such a
// file (a process killed before it wrote its trace leaves only FILE.partial, cut short).
Result<LoadedTrace> LoadTrace(const std::string& path);

struct MergeStats {
  int processes = 0;                 // files merged
  size_t events = 0;
  std::vector<std::string> missing;  // inputs that were not there (a process that never started tracing)
};

// Merges the per-process files `inputs` (in that order: the order of the tracks) into `out`
// (written as OUT.partial, then renamed). Missing inputs are skipped and listed; an unreadable
// one is an error. One input in memory at a time.
Result<MergeStats> MergeTraces(const std::vector<std::string>& inputs, const std::string& out);

// The gnuplot script of a picture of `trace`: one row per process, `steps` steps of the first
// worker from the middle of the run (all of it when no worker has steps), each span a bar
// coloured by what it is (compute, straggler delay, push, pull, apply, waits), failures marked.
// Its data goes to `data_path`.
std::string TimelineScript(const LoadedTrace& trace, const std::string& png, const std::string& data_path, int steps);
// Writes the script beside `png` and runs gnuplot on it.
Status DrawTimeline(const LoadedTrace& trace, const std::string& png, int steps);

}  // namespace gradsync
