// Launcher: starts one job on this machine (1 scheduler + S servers + N workers, on 127.0.0.1
// with ephemeral ports, or each in a network namespace of its own), waits for it, and
// summarizes it. Any failure or interruption stops every process of the job.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/train_config.h"
#include "common/obs/metrics.h"
#include "experiments/process/process.h"
#include "experiments/trace/trace_merge.h"

namespace gradsync {

struct LaunchOptions {
  std::string bin_dir;        // where gradsync-server and gradsync-worker are
  std::string out_dir;        // logs, worker-<r>.csv and .json, server-<r>.json
  config::Mode mode = config::BSP;  // BSP | SSP | ASP | ALLREDUCE
  int staleness = 0;
  int num_servers = 1;
  int num_workers = 1;
  std::vector<std::string> worker_args;  // passed to every worker
  std::map<int, std::vector<std::string>> worker_extra_args;  // per worker rank, after worker_args
  // Runs this command as every worker instead of gradsync-worker: argv[0] is looked up on the
  // PATH, and "python3" or "python" (exactly) becomes the interpreter the gradsync Python
  // package was built for (GRADSYNC_PYTHON_EXECUTABLE, when CMake found one). Each worker's
  // flags (the launcher's, worker_args, its worker_extra_args) reach it as the GRADSYNC_*
  // variables gradsync-worker would read them from (FlagsToEnv), and <bin_dir>/../python, when
  // that folder exists, comes first on its PYTHONPATH. Empty: gradsync-worker with flags.
  std::vector<std::string> worker_command;
  // Where each process runs: an argv prefix (e.g. "ip netns exec NS") and the address it binds
  // and advertises. Hosts: 0 = the scheduler, 1..S = the servers, S+1.. = the workers.
  // Unset: no prefix, 127.0.0.1.
  std::function<std::vector<std::string>(int host)> host_prefix;
  std::function<std::string(int host)> host_address;
  std::function<void()> on_tick;  // runs about every 250 ms while the job runs
  double heartbeat_timeout_s = 10.0;
  std::string auth_dir;       // --auth-dir for every process (CURVE), "" = plaintext
  double timeout_s = 3600.0;
  bool worker0_to_stdout = true;  // otherwise logs/worker-0.log
  bool dry_run = false;       // print the commands only
  // Every process writes a Chrome trace (--trace) to out_dir/traces/<role>[-<rank>].json, merged
  // into out_dir/trace.json when the job ends, however it ended (experiments/trace/trace_merge.h).
  bool trace = false;
};

struct LaunchResult {
  std::map<int64_t, int64_t> version_lag;      // over all shards: gradients by version lag
  std::map<int64_t, int64_t> clock_staleness;  // over all shards: answered pulls by clock staleness
  int64_t gradients = 0;
  int64_t rejected = 0;
  std::string trace;     // out_dir/trace.json when the traces were merged, else ""
  MergeStats trace_stats;
};

// Where process `role` (scheduler, server, worker) `rank` writes its trace in a job with `o.trace`.
std::string TraceFile(const LaunchOptions& o, const std::string& role, int rank);
// Merges the job's traces into out_dir/trace.json (what LaunchPsJob does when the job ends).
Result<MergeStats> MergeJobTraces(const LaunchOptions& o);

// The flag that `arg` (a worker argument) sets although the launcher sets it itself for every
// worker (--mode, --scheduler, --rank, --out, --staleness, --host, --bind,
// --heartbeat-timeout, --auth-dir), or nullptr.
const char* LauncherOwnedFlag(const std::string& arg);

// The processes of a job as LaunchPsJob starts them (without o.host_prefix): the scheduler
// binding `bind` (with port_args: "--port-file=F" or "--port=P"), server `s` and worker `w`
// joining the scheduler at `endpoint` and binding and advertising `address`. "" log: inherit.
ChildSpec SchedulerSpec(const LaunchOptions& o, const std::string& bind, const std::vector<std::string>& port_args);
ChildSpec ServerSpec(const LaunchOptions& o, int s, const std::string& endpoint, const std::string& address,
                     const std::string& log_path);
ChildSpec WorkerSpec(const LaunchOptions& o, int w, const std::string& endpoint, const std::string& address,
                     const std::string& log_path);

Result<LaunchResult> LaunchPsJob(const LaunchOptions& options, const volatile bool* interrupted = nullptr);

}  // namespace gradsync
