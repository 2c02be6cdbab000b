// One task of a job started by a cluster's own launcher (srun, mpirun / mpiexec, torchrun), for
// `gradsync-launch --cluster` / `--slurm`. Every task runs the same command; its rank in the
// launcher's world picks its role:
//
//   tasks 0 .. S-1       server shards 0 .. S-1 (none in all-reduce)
//   tasks S .. S+N-1     workers 0 .. N-1
//   task 0 also          the scheduler, as a child process beside its own role
//
// The scheduler's address is --scheduler=HOST:PORT, else MASTER_ADDR and MASTER_PORT + 1
// (torchrun's variables; MASTER_PORT itself stays free for torch.distributed), else the first
// host of the Slurm allocation with a port derived from the job and step ids. Each task
// advertises the address its host uses to reach the scheduler (or --iface's).
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/config/cluster.h"
#include "experiments/launch/launcher.h"

namespace gradsync {

struct ClusterTaskOptions {
  // The job: mode, staleness, num_servers (S), num_workers (N; -1: every task that is not a
  // server), out_dir, the workers' flags or command, heartbeat, auth_dir, bin_dir, timeout_s.
  LaunchOptions job;
  bool slurm_only = false;   // --slurm: the rank must be Slurm's (a job step)
  std::string scheduler;     // HOST:PORT; "" = from the launcher's variables
  int port = 0;              // the scheduler's port when its host comes from the launcher (0: derived)
  std::string iface;         // advertise this interface's IPv4 address
  // out_dir is a node-local staging folder: the task writes under out_dir/task-<t>, prints the
  // files (file_relay.h) when its processes are done, and removes them. gradsync-run --slurm.
  bool emit_files = false;
};

// Where a task sits and what it runs, from the options and the environment alone.
struct ClusterPlace {
  LauncherRank launcher;
  int servers = 0;
  int workers = 0;
  bool server = false;       // else a worker
  int role_rank = 0;         // the shard's or the worker's rank
  std::string scheduler_host;
  int scheduler_port = 0;
  bool spans_hosts = false;  // the launcher says the job's tasks are on more than one host
};
Result<ClusterPlace> PlaceTask(const ClusterTaskOptions& options, const EnvLookup& env);

// Runs this task's processes until they end; prints its files when emit_files. A line on
// stderr says where it sits. Fails naming the process that failed.
Status RunClusterTask(const ClusterTaskOptions& options, const EnvLookup& env, const volatile bool* interrupted);

}  // namespace gradsync
