// Launcher: starts one parameter-server job on this machine (1 scheduler + S servers + N
// workers on 127.0.0.1 with ephemeral ports), waits for it, and summarizes it. Any failure
// stops every process of the job. The experiments issue grows this into spec-driven sweeps.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/status.h"

namespace gradsync {

struct LaunchOptions {
  std::string bin_dir;        // where gradsync-server and gradsync-worker are
  std::string out_dir;        // logs, worker-<r>.csv, server-<r>.csv
  std::string mode = "bsp";   // bsp | ssp | asp
  int staleness = 0;
  int num_servers = 1;
  int num_workers = 1;
  std::vector<std::string> worker_args;  // passed to every worker
  double heartbeat_timeout_s = 10.0;
  double timeout_s = 3600.0;
  bool worker0_to_stdout = true;
  bool dry_run = false;       // print the commands only
};

struct LaunchResult {
  std::map<int64_t, int64_t> staleness;  // over all shards
  int64_t gradients = 0;
  int64_t rejected = 0;
};

Result<LaunchResult> LaunchPsJob(const LaunchOptions& options, const volatile bool* interrupted = nullptr);

}  // namespace gradsync
