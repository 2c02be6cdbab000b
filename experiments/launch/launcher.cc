#include "experiments/launch/launcher.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>
#include <thread>

#include "common/config/flags.h"
#include "common/obs/process_summary.h"
#include "experiments/process/process.h"
#include "gradsync/config.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;

// The worker command as it runs: "python3" and "python" name the interpreter the gradsync
// Python package was built for, when CMake found one.
std::vector<std::string> ResolvedCommand(std::vector<std::string> command) {
  constexpr std::string_view python = GRADSYNC_PYTHON_EXECUTABLE;
  if (!python.empty() && (command[0] == "python3" || command[0] == "python")) command[0] = python;
  return command;
}

// <bin_dir>/../python (the build tree's and the install's Python package) before the PYTHONPATH
// this process has; "" when there is no such folder.
std::string WorkerPythonPath(const std::string& bin_dir) {
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(fs::path(bin_dir) / ".." / "python", ec);
  if (ec || !fs::is_directory(dir, ec)) return "";
  const char* old = std::getenv("PYTHONPATH");
  return dir.string() + (old && *old ? ":" + std::string(old) : "");
}

}  // namespace

const char* LauncherOwnedFlag(const std::string& arg) {
  for (const char* owned : {"--mode", "--scheduler", "--rank", "--out", "--staleness", "--host", "--bind",
                            "--heartbeat-timeout", "--auth-dir"}) {
    if (arg == owned || arg.rfind(std::string(owned) + "=", 0) == 0) return owned;
  }
  return nullptr;
}

namespace {

std::string HeartbeatFlag(const LaunchOptions& o) { return "--heartbeat-timeout=" + ShortestText(o.heartbeat_timeout_s); }

// Every process gets the cluster's keys (CURVE on every socket) when the job has them.
std::vector<std::string> Secured(const LaunchOptions& o, std::vector<std::string> argv) {
  if (!o.auth_dir.empty()) argv.push_back("--auth-dir=" + o.auth_dir);
  return argv;
}

std::vector<std::string> ModeArgs(const LaunchOptions& o) {
  std::vector<std::string> args = {"--mode=" + ModeName(o.mode)};
  if (o.mode == config::SSP) args.push_back("--staleness=" + std::to_string(o.staleness));
  return args;
}

// --trace=FILE for process `role` `rank` when the job is traced.
void AddTrace(const LaunchOptions& o, const std::string& role, int rank, std::vector<std::string>* argv) {
  if (o.trace) argv->push_back("--trace=" + TraceFile(o, role, rank));
}

}  // namespace

std::string TraceFile(const LaunchOptions& o, const std::string& role, int rank) {
  return o.out_dir + "/traces/" + (role == "scheduler" ? role : role + "-" + std::to_string(rank)) + ".json";
}

Result<MergeStats> MergeJobTraces(const LaunchOptions& o) {
  std::vector<std::string> files = {TraceFile(o, "scheduler", 0)};
  for (int s = 0; s < o.num_servers; ++s) files.push_back(TraceFile(o, "server", s));
  for (int w = 0; w < o.num_workers; ++w) files.push_back(TraceFile(o, "worker", w));
  return MergeTraces(files, o.out_dir + "/trace.json");
}

ChildSpec SchedulerSpec(const LaunchOptions& o, const std::string& bind, const std::vector<std::string>& port_args) {
  // The scheduler of an all-reduce job only rendezvouses the workers: it needs the mode too.
  std::vector<std::string> argv = {o.bin_dir + "/gradsync-server", "--role=scheduler",
                                   "--num-servers=" + std::to_string(o.num_servers),
                                   "--num-workers=" + std::to_string(o.num_workers)};
  argv.insert(argv.end(), port_args.begin(), port_args.end());
  argv.insert(argv.end(), {HeartbeatFlag(o), "--mode=" + ModeName(o.mode), "--bind=" + bind});
  AddTrace(o, "scheduler", 0, &argv);
  return {"scheduler", Secured(o, argv), o.out_dir + "/logs/scheduler.log"};
}

ChildSpec ServerSpec(const LaunchOptions& o, int s, const std::string& endpoint, const std::string& address,
                     const std::string& log_path) {
  std::vector<std::string> argv = {o.bin_dir + "/gradsync-server", "--role=server", "--scheduler=" + endpoint,
                                   "--rank=" + std::to_string(s), "--out=" + o.out_dir, HeartbeatFlag(o),
                                   "--bind=" + address, "--host=" + address};
  const std::vector<std::string> mode = ModeArgs(o);
  argv.insert(argv.end(), mode.begin(), mode.end());
  AddTrace(o, "server", s, &argv);
  return {"server " + std::to_string(s), Secured(o, argv), log_path};
}

ChildSpec WorkerSpec(const LaunchOptions& o, int w, const std::string& endpoint, const std::string& address,
                     const std::string& log_path) {
  std::vector<std::string> flags = {"--scheduler=" + endpoint, "--rank=" + std::to_string(w), "--out=" + o.out_dir,
                                    HeartbeatFlag(o), "--host=" + address};
  if (o.mode == config::ALLREDUCE) flags.push_back("--bind=" + address);
  const std::vector<std::string> mode = ModeArgs(o);
  flags.insert(flags.end(), mode.begin(), mode.end());
  AddTrace(o, "worker", w, &flags);
  flags.insert(flags.end(), o.worker_args.begin(), o.worker_args.end());
  if (auto it = o.worker_extra_args.find(w); it != o.worker_extra_args.end()) {
    flags.insert(flags.end(), it->second.begin(), it->second.end());
  }
  flags = Secured(o, flags);
  ChildSpec c{"worker " + std::to_string(w), {}, log_path};
  if (!o.worker_command.empty()) {
    // The same settings, as the variables gradsync-worker would read them from.
    c.argv = ResolvedCommand(o.worker_command);
    c.env = FlagsToEnv(flags);
    if (const std::string python_path = WorkerPythonPath(o.bin_dir); !python_path.empty()) {
      c.env.emplace_back("PYTHONPATH", python_path);
    }
  } else {
    flags.insert(flags.begin(), o.bin_dir + "/gradsync-worker");
    c.argv = flags;
  }
  return c;
}

namespace {

// The job's folders: OUT/logs, OUT/traces (emptied) with --trace, and no port file left over.
Status PrepareOutDir(const LaunchOptions& o, const std::string& port_file) {
  std::error_code ec;
  fs::create_directories(o.out_dir + "/logs", ec);
  if (ec) return InvalidArgumentError(o.out_dir + ": cannot create: " + ec.message());
  if (o.trace) {
    fs::remove_all(o.out_dir + "/traces", ec);  // this job's traces only
    fs::create_directories(o.out_dir + "/traces", ec);
    if (ec) return InvalidArgumentError(o.out_dir + "/traces: cannot create: " + ec.message());
  }
  fs::remove(port_file, ec);
  return OkStatus();
}

// Host `host`'s address: the emulated network's, else loopback.
std::string HostAddress(const LaunchOptions& o, int host) {
  return o.host_address ? o.host_address(host) : std::string("127.0.0.1");
}

// The process as it runs on host `host` (behind the host's prefix: its network namespace).
ChildSpec Placed(const LaunchOptions& o, int host, ChildSpec c) {
  if (!o.host_prefix) return c;
  std::vector<std::string> full = o.host_prefix(host);
  full.insert(full.end(), c.argv.begin(), c.argv.end());
  c.argv = full;
  return c;
}

// The scheduler binds an ephemeral port and writes it down: the port, once it has.
Result<std::string> WaitForPort(const LaunchOptions& o, const std::string& port_file, ProcessGroup& group) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string port;
  while (port.empty()) {
    std::ifstream f(port_file);
    if (f) std::getline(f, port);
    if (!port.empty()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      group.KillAll();
      return UnavailableError("the scheduler did not start (see " + o.out_dir + "/logs/scheduler.log)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return port;
}

// The servers' and the workers' processes, each on its host.
std::vector<ChildSpec> JobSpecs(const LaunchOptions& o, const std::string& endpoint) {
  std::vector<ChildSpec> specs;
  for (int s = 0; s < o.num_servers; ++s) {
    specs.push_back(Placed(o, 1 + s, ServerSpec(o, s, endpoint, HostAddress(o, 1 + s),
                                                o.out_dir + "/logs/server-" + std::to_string(s) + ".log")));
  }
  for (int w = 0; w < o.num_workers; ++w) {
    const int host = 1 + o.num_servers + w;
    const std::string log = (w == 0 && o.worker0_to_stdout) ? "" : o.out_dir + "/logs/worker-" + std::to_string(w) + ".log";
    specs.push_back(Placed(o, host, WorkerSpec(o, w, endpoint, HostAddress(o, host), log)));
  }
  return specs;
}

// A PS job's numbers, from its shards' summaries.
Status AddShardSummaries(const LaunchOptions& o, LaunchResult& r) {
  for (int k = 0; k < o.num_servers; ++k) {
    ASSIGN_OR_RETURN(summary::ProcessSummary shard, ReadProcessSummary(ProcessSummaryPath(o.out_dir, "server", k)));
    AddHistogram(shard.version_lag(), &r.version_lag);
    AddHistogram(shard.clock_staleness(), &r.clock_staleness);
    r.gradients += shard.pushes();  // summed over shards; divided below
    r.rejected += shard.rejected();
  }
  // Every gradient is applied on every shard: count it once.
  r.gradients /= std::max(1, o.num_servers);
  return OkStatus();
}

}  // namespace

Result<LaunchResult> LaunchPsJob(const LaunchOptions& o, const volatile bool* interrupted) {
  const std::string port_file = o.out_dir + "/logs/scheduler.port";
  if (!o.dry_run) RETURN_IF_ERROR(PrepareOutDir(o, port_file));  // a dry run leaves the disk as it is
  const bool allreduce = o.mode == config::ALLREDUCE;

  ChildSpec sched = Placed(o, 0, SchedulerSpec(o, HostAddress(o, 0), {"--port-file=" + port_file}));
  std::ofstream commands;
  if (!o.dry_run) commands.open(o.out_dir + "/commands.txt");
  if (o.dry_run) {
    std::cout << JoinArgs(sched.argv) << "\n";
  }
  ProcessGroup group;
  std::string endpoint = HostAddress(o, 0) + ":PORT";
  if (!o.dry_run) {
    RETURN_IF_ERROR(group.Spawn(sched));
    commands << JoinArgs(sched.argv) << "\n";
    ASSIGN_OR_RETURN(const std::string port, WaitForPort(o, port_file, group));
    endpoint = HostAddress(o, 0) + ":" + port;
  }
  const std::vector<ChildSpec> specs = JobSpecs(o, endpoint);
  const bool command = !o.worker_command.empty();
  for (const auto& c : specs) {
    if (o.dry_run) {
      std::cout << CommandLine(c) << "\n";
      continue;
    }
    commands << CommandLine(c) << "\n";
    RETURN_IF_ERROR(group.Spawn(c));
  }
  if (o.dry_run) return LaunchResult{};
  commands.close();
  Status s = group.WaitAll(o.timeout_s, interrupted, o.on_tick);
  LaunchResult r;
  if (o.trace) {
    // Merged however the job ended: a failed job's timeline is where to look first.
    auto merged = MergeJobTraces(o);
    if (merged.ok()) {
      r.trace = o.out_dir + "/trace.json";
      r.trace_stats = *merged;
    } else if (s.ok()) {
      return merged.status().WithContext("merging the job's traces");
    }
  }
  if (!s.ok()) {
    return s.WithContext("job failed (" + (command ? "worker command '" + JoinArgs(o.worker_command) + "'; " : std::string()) +
                         "logs in " + o.out_dir + "/logs)");
  }
  if (allreduce) return r;
  RETURN_IF_ERROR(AddShardSummaries(o, r));
  return r;
}

}  // namespace gradsync
