// The experiment runner behind gradsync-run: each selected run of a spec in turn (scheduler,
// servers and workers of the run, on loopback or in emulated links), a live progress line per
// run, the run's metrics merged, and the experiment's summary and plots at the end.
#pragma once

#include <iosfwd>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "experiments/spec/spec.h"

namespace gradsync {

struct RunnerOptions {
  std::string out_dir = "results";   // results go to out_dir/<experiment>/
  std::set<std::string> only;        // run these runs (empty: all)
  bool dry_run = false;              // print the commands, start nothing
  // Start nothing: the report (summary.md, summary.json, plots) from the run folders in
  // out_dir/<experiment>/ that earlier runs left (the selected runs, or all), e.g. after runs made
  // over several sessions with --only. A run the earlier summary.json says failed stays failed;
  // one it does not list counts as ended when its worker 0 wrote its end-of-run summary.
  bool report_only = false;
  std::string bin_dir;               // gradsync-server and gradsync-worker
  double heartbeat_timeout_s = 10.0;
  std::string auth_dir;              // --auth-dir for every process of every run ("" = plaintext)
  // Each run as a Slurm job: `srun` (from where gradsync-run runs) starts servers + workers
  // tasks of `gradsync-launch --slurm --emit-files`, which write to a node-local folder and
  // print their files at the end; the runner writes them into the run's folder, so the nodes
  // need no shared filesystem. Links cannot be emulated across nodes: such a run is refused.
  bool slurm = false;
  std::vector<std::string> srun_args;  // added to every srun (--partition=..., --account=...)
};

// The srun command line of one run with --slurm; `stage` is the tasks' node-local folder.
std::vector<std::string> SlurmRunCommand(const std::string& experiment, const RunPlan& plan, const RunnerOptions& o,
                                         const std::string& stage);

// Runs the experiment. Fails (naming them) when any run failed; on interruption stops at once.
// Prints progress and the summary table to `out`.
Status RunExperiment(const Experiment& e, const RunnerOptions& options, std::ostream& out,
                     const volatile bool* interrupted = nullptr);

}  // namespace gradsync
