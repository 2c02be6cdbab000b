// The experiment runner behind gradsync-run: each selected run of a spec in turn (scheduler,
// servers and workers of the run, on loopback or in emulated links), a live progress line per
// run, the run's metrics merged, and the experiment's summary and plots at the end.
#pragma once

#include <iosfwd>
#include <set>
#include <string>

#include "common/status.h"
#include "experiments/spec.h"

namespace gradsync {

struct RunnerOptions {
  std::string out_dir = "results";   // results go to out_dir/<experiment>/
  std::set<std::string> only;        // run these runs (empty: all)
  bool dry_run = false;              // print the commands, start nothing
  std::string bin_dir;               // gradsync-server and gradsync-worker
  double heartbeat_timeout_s = 10.0;
  std::string auth_dir;              // --auth-dir for every process of every run ("" = plaintext)
};

// Runs the experiment. Fails (naming them) when any run failed; on interruption stops at once.
// Prints progress and the summary table to `out`.
Status RunExperiment(const Experiment& e, const RunnerOptions& options, std::ostream& out,
                     const volatile bool* interrupted = nullptr);

}  // namespace gradsync
