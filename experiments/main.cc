// gradsync-launch: one parameter-server or all-reduce job on this machine with one command:
//   gradsync-launch --servers=2 --workers=4 --mode=ssp --staleness=3 --out=results/ssp -- --model=mlp --epochs=10
//   gradsync-launch --servers=2 --workers=4 --mode=ssp --staleness=3 python3 train.py --epochs=3
// The words after "--" go to every gradsync-worker as flags; a command (the first word that is
// not the launcher's option, or the first after "--" that does not start with '-') runs as
// every worker instead, with the job in its environment. Worker 0's output is shown; the rest
// is logged under OUT/logs/. Ctrl-C stops every process of the job.
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <vector>

#include "common/config/cluster.h"
#include "common/config/flags.h"
#include "experiments/launch/cluster_task.h"
#include "experiments/launch/launcher.h"
#include "experiments/spec/progress.h"
#include "gradsync/config.h"

namespace gradsync {
namespace {

volatile bool g_interrupted = false;
void OnSignal(int) { g_interrupted = true; }

// Where the workers' part of the command line starts: the index of "--", or of the first word
// that is not one of `own` options (nor the value of one, as in "--out DIR"); argc when neither.
int WorkersPart(const po::options_description& own, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--" || !a.starts_with("-")) return i;
    if (a.starts_with("--") && a.find('=') == std::string_view::npos) {
      const po::option_description* option = own.find_nothrow(std::string(a.substr(2)), false);
      if (option && option->semantic()->max_tokens() > 0) ++i;
    }
  }
  return argc;
}

std::string Summary() {
  constexpr std::string_view python = GRADSYNC_PYTHON_EXECUTABLE;
  return "Starts 1 scheduler + S servers + N workers on 127.0.0.1 (ephemeral ports), waits, and prints\n"
         "the staleness summary. The workers are gradsync-worker, with the words after -- as its flags,\n"
         "or COMMAND: the first word that is none of the options below (or the first after -- that does\n"
         "not start with '-'), run once per worker with its ARGS and the job in its environment, as the\n"
         "variables gradsync-worker reads its flags from: GRADSYNC_SCHEDULER, GRADSYNC_RANK, GRADSYNC_OUT,\n"
         "GRADSYNC_HEARTBEAT_TIMEOUT, GRADSYNC_HOST, GRADSYNC_BIND (allreduce), GRADSYNC_MODE,\n"
         "GRADSYNC_STALENESS (ssp), GRADSYNC_AUTH_DIR (with --auth-dir). COMMAND is looked up on the PATH;\n" +
         (python.empty() ? std::string("python3 and python run as given (no Python interpreter was found at build time)")
                         : "python3 and python run the interpreter the gradsync Python package was built for,\n" +
                               std::string(python)) +
         ";\nBIN_DIR/../python, when it exists, comes first on COMMAND's PYTHONPATH.\n\n"
         "With --cluster (or --slurm), a cluster's launcher starts this command once per task\n"
         "(srun -n S+N, mpirun -n S+N, torchrun --nproc-per-node=...), and the task's rank picks its role:\n"
         "tasks 0..S-1 are the servers, the rest the workers, and task 0 runs the scheduler beside its own\n"
         "role. Ranks come from RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/_SIZE (Open MPI), PMI_RANK/\n"
         "PMI_SIZE (MPICH, Intel MPI) or SLURM_PROCID/SLURM_STEP_NUM_TASKS (srun), innermost launcher first.\n"
         "The scheduler is at --scheduler, else MASTER_ADDR:MASTER_PORT+1, else the Slurm allocation's\n"
         "first host (port --port, default 10000 + a number from the job and step ids).";
}

// The value of worker flag `name` (--name=V or --name V) in `args`, or `fallback`.
template <typename T>
T WorkerFlag(const std::vector<std::string>& args, const std::string& name, T fallback) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string v;
    if (args[i].starts_with("--" + name + "=")) v = args[i].substr(name.size() + 3);
    else if (args[i] == "--" + name && i + 1 < args.size()) v = args[i + 1];
    else continue;
    try {
      return static_cast<T>(std::stoll(v));
    } catch (const std::exception&) {
      return fallback;
    }
  }
  return fallback;
}

// The lines of worker 0's log from its last "final test_acc" on ("" when none).
std::string FinalLines(const std::string& log) {
  std::ifstream f(log);
  std::string line, out;
  while (std::getline(f, line)) {
    if (line.starts_with("final test_acc")) out.clear();
    if (!out.empty() || line.starts_with("final test_acc")) out += line + "\n";
  }
  return out;
}

void DeclareFlags(FlagParser& flags) {
  flags.options().add_options()
      ("mode", po::value<std::string>()->default_value("bsp"), "bsp|ssp|asp|allreduce")
      ("staleness", po::value<int>(), "ssp: the staleness bound S (required with --mode=ssp; 0 is bsp's lockstep)")
      ("servers", po::value<int>()->default_value(1), "server shards")
      ("workers", po::value<int>()->default_value(1), "workers (--cluster: every task that is not a server)")
      ("out", po::value<std::string>()->default_value("results/launch"), "output directory")
      ("heartbeat-timeout", po::value<double>()->default_value(10.0), "seconds before a silent node is dead")
      ("auth-dir", po::value<std::string>(), "CURVE on every socket with the keys gradsync-keygen wrote here (passed to every process)")
      ("timeout", po::value<double>()->default_value(3600.0), "seconds before the whole job is stopped")
      ("worker-extra", po::value<std::vector<std::string>>()->composing(), "R:FLAG: one more flag for worker R only (repeatable)")
      ("cluster", po::bool_switch(), "run as one task of a job that srun, mpirun or torchrun started (see above)")
      ("slurm", po::bool_switch(), "--cluster, with the rank from Slurm (srun)")
      ("scheduler", po::value<std::string>(), "--cluster: the scheduler's HOST:PORT (HOST: where task 0 runs)")
      ("port", po::value<int>()->default_value(0), "--cluster: the scheduler's port when its host comes from the launcher (0: derived)")
      ("iface", po::value<std::string>(), "--cluster: advertise this network interface's address (default: the one toward the scheduler)")
      ("emit-files", po::bool_switch(), "--cluster: write to OUT/task-<t>, then print the files on stdout and remove them (gradsync-run --slurm collects them)")
      ("trace", po::bool_switch(), "every process writes a Chrome trace to OUT/traces/; they are merged into OUT/trace.json (one track per process, on the scheduler's clock; open it in Perfetto or chrome://tracing)")
      ("dry-run", po::bool_switch(), "print the commands only")
      ("bin-dir", po::value<std::string>(), "where the gradsync binaries are (default: next to this one)");
}

// The job's options from the launcher's own flags (FlagParser::Fail exits on a bad one).
LaunchOptions JobOptions(const FlagParser& flags, const po::variables_map& vm) {
  LaunchOptions o;
  auto mode = ParseMode(vm["mode"].as<std::string>());
  if (!mode.ok() || !(IsPsMode(*mode) || *mode == config::ALLREDUCE)) flags.Fail("--mode must be bsp, ssp, asp or allreduce");
  o.mode = *mode;
  o.staleness = vm.count("staleness") ? vm["staleness"].as<int>() : 0;
  if (o.staleness < 0) flags.Fail("--staleness must be >= 0");
  if (vm.count("staleness") && o.mode != config::SSP) flags.Fail("--staleness applies to --mode=ssp only");
  // As a spec does: an ssp job without its bound would silently run in lockstep (s = 0).
  if (o.mode == config::SSP && !vm.count("staleness")) flags.Fail("--mode=ssp needs a staleness bound (--staleness=S)");
  o.num_servers = vm["servers"].as<int>();
  o.num_workers = vm["workers"].as<int>();
  if (o.mode == config::ALLREDUCE) {
    if (FlagGiven(vm, "servers") && o.num_servers != 0) flags.Fail("--mode=allreduce runs without servers (--servers=0)");
    o.num_servers = 0;
  } else if (o.num_servers < 1 || o.num_servers > 64) {
    flags.Fail("--servers must be in [1, 64]");
  }
  if (o.num_workers < 1 || o.num_workers > 256) flags.Fail("--workers must be in [1, 256]");
  o.out_dir = vm["out"].as<std::string>();
  o.heartbeat_timeout_s = vm["heartbeat-timeout"].as<double>();
  if (vm.count("auth-dir")) {
    o.auth_dir = std::filesystem::absolute(vm["auth-dir"].as<std::string>()).string();
    if (!std::filesystem::is_directory(o.auth_dir)) flags.Fail("--auth-dir: " + o.auth_dir + " is not a directory (gradsync-keygen DIR makes one)");
  }
  o.timeout_s = vm["timeout"].as<double>();
  o.dry_run = vm["dry-run"].as<bool>();
  o.trace = vm["trace"].as<bool>();
  o.bin_dir = vm.count("bin-dir") ? vm["bin-dir"].as<std::string>()
                                  : std::filesystem::canonical("/proc/self/exe").parent_path().string();
  return o;
}

// The words after the launcher's options: after "--", gradsync-worker's flags, unless the first
// word is a command; without "--", the command.
void TakeWorkerWords(const FlagParser& flags, int split, int argc, char** argv, LaunchOptions* o) {
  const bool dashes = split < argc && std::string_view(argv[split]) == "--";
  const int first = dashes ? split + 1 : split;
  if (dashes && (first == argc || argv[first][0] == '-')) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (const char* owned = LauncherOwnedFlag(a)) {
        flags.Fail(std::string(owned) + " is set by the launcher; do not pass it to the workers");
      }
      o->worker_args.push_back(a);
    }
  } else {
    o->worker_command.assign(argv + first, argv + argc);
  }
}

// --worker-extra=R:FLAG, into o->worker_extra_args.
void TakeWorkerExtra(const FlagParser& flags, const po::variables_map& vm, LaunchOptions* o) {
  if (vm.count("worker-extra")) {
    for (const std::string& e : vm["worker-extra"].as<std::vector<std::string>>()) {
      const size_t colon = e.find(':');
      int w = -1;
      try {
        w = colon == std::string::npos ? -1 : std::stoi(e.substr(0, colon));
      } catch (const std::exception&) {
      }
      if (w < 0 || e.size() == colon + 1 || e[colon + 1] != '-') flags.Fail("--worker-extra=" + e + ": give RANK:--FLAG[=VALUE]");
      if (const char* owned = LauncherOwnedFlag(e.substr(colon + 1))) {
        flags.Fail(std::string(owned) + " is set by the launcher; do not pass it to the workers");
      }
      o->worker_extra_args[w].push_back(e.substr(colon + 1));
    }
  }
}

// --cluster: this process is one task of the job, which its rank picks. The exit code.
int RunAsClusterTask(const FlagParser& flags, const po::variables_map& vm, const LaunchOptions& o) {
  ClusterTaskOptions c;
  c.job = o;
  if (!FlagGiven(vm, "workers")) c.job.num_workers = -1;  // every task that is not a server
  c.slurm_only = vm["slurm"].as<bool>();
  if (vm.count("scheduler")) c.scheduler = vm["scheduler"].as<std::string>();
  c.port = vm["port"].as<int>();
  if (c.port < 0 || c.port > 65535) flags.Fail("--port must be in [0, 65535]");
  if (vm.count("iface")) c.iface = vm["iface"].as<std::string>();
  c.emit_files = vm["emit-files"].as<bool>();
  if (Status s = RunClusterTask(c, ProcessEnv(), &g_interrupted); !s.ok()) {
    std::cerr << "gradsync-launch: error: " << s.message() << std::endl;
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

// The job's line: its shape, and (PS modes) the staleness and lags its servers saw.
void PrintJobSummary(const LaunchOptions& o, const LaunchResult& r) {
  if (o.mode == config::ALLREDUCE) {
    std::printf("job: allreduce, %d workers; results in %s\n", o.num_workers, o.out_dir.c_str());
    return;
  }
  auto p50_99_max = [](const std::map<int64_t, int64_t>& h) {
    return std::to_string(HistogramQuantile(h, 0.5)) + "/" + std::to_string(HistogramQuantile(h, 0.99)) + "/" +
           std::to_string(h.empty() ? 0 : h.rbegin()->first);
  };
  std::printf("job: %s%s, %d server%s, %d worker%s: %lld gradients applied; clock staleness p50/p99/max %s clocks, "
              "version lag p50/p99/max %s updates; %lld requests rejected; results in %s\n",
              ModeName(o.mode).c_str(), o.mode == config::SSP ? (" s=" + std::to_string(o.staleness)).c_str() : "", o.num_servers,
              o.num_servers == 1 ? "" : "s", o.num_workers, o.num_workers == 1 ? "" : "s",
              static_cast<long long>(r.gradients), p50_99_max(r.clock_staleness).c_str(),
              p50_99_max(r.version_lag).c_str(), static_cast<long long>(r.rejected), o.out_dir.c_str());
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-launch", Summary(),
                   "gradsync-launch [options] [-- WORKER-FLAGS... | [--] COMMAND [ARGS...]]");
  DeclareFlags(flags);
  const int split = WorkersPart(flags.options(), argc, argv);
  auto vm = flags.ParseOrExit(split, argv);
  LaunchOptions o = JobOptions(flags, vm);
  TakeWorkerWords(flags, split, argc, argv, &o);
  TakeWorkerExtra(flags, vm, &o);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const bool cluster = vm["cluster"].as<bool>() || vm["slurm"].as<bool>();
  for (const char* f : {"scheduler", "port", "iface", "emit-files"}) {
    if (!cluster && FlagGiven(vm, f)) flags.Fail(std::string("--") + f + " applies with --cluster or --slurm only");
  }
  if (cluster && o.trace) flags.Fail("--trace applies to jobs on this machine, not --cluster or --slurm (yet)");
  if (cluster) return RunAsClusterTask(flags, vm, o);
  // On a terminal: a live progress line from worker 0's metrics (its own output goes to its log,
  // whose final line is shown at the end). Otherwise worker 0 prints its epochs here itself.
  std::optional<ProgressLine> progress;
  if (!o.dry_run && ::isatty(1)) {
    o.worker0_to_stdout = false;
    // A command's epochs are its own business: not known here.
    const int epochs = o.worker_command.empty() ? WorkerFlag(o.worker_args, "epochs", config::TrainConfig().epochs()) : 0;
    const int64_t max_steps = WorkerFlag<int64_t>(o.worker_args, "max-steps", 0);
    progress.emplace(std::cout, ModeName(o.mode), epochs, max_steps, o.out_dir + "/worker-0.csv");
    o.on_tick = [&progress] { progress->Tick(); };
  }
  auto r = LaunchPsJob(o, &g_interrupted);
  if (progress) {
    progress->Tick();
    progress->Done(r.status());
    std::cout << FinalLines(o.out_dir + "/logs/worker-0.log") << std::flush;
  }
  if (!r.ok()) {
    std::cerr << "gradsync-launch: error: " << r.status().message() << std::endl;
    return 1;
  }
  if (!o.dry_run && !r->trace.empty()) {
    std::printf("trace: %s (%d processes, %zu events; open it in Perfetto or chrome://tracing)\n", r->trace.c_str(),
                r->trace_stats.processes, r->trace_stats.events);
    for (const auto& m : r->trace_stats.missing) std::printf("trace: %s was not written\n", m.c_str());
  }
  if (!o.dry_run) PrintJobSummary(o, *r);
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
