// gradsync-run SPEC: runs every run of an experiment spec on this machine and writes
// results/<experiment>/ (per run metrics.csv and commands.txt; summary.md, summary.json, plots).
//   gradsync-run experiments/specs/quick.textproto [--only=bsp,ssp3] [--dry-run] [--out=DIR]
// Ctrl-C stops the running run's processes (and its network namespaces) and exits.
#include <csignal>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "common/config/flags.h"
#include "experiments/launch/runner.h"
#include "experiments/process/process.h"

namespace gradsync {
namespace {

volatile bool g_interrupted = false;
void OnSignal(int) { g_interrupted = true; }

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-run",
                   "Runs each run of the experiment SPEC (protobuf text format, see experiments/README.md)\n"
                   "and writes OUT/<experiment>/: per run metrics.csv and commands.txt, summary.md,\n"
                   "summary.json and PNG plots.",
                   "gradsync-run SPEC [options]");
  flags.options().add_options()
      ("spec", po::value<std::string>(), "the experiment spec (also the first positional argument)")
      ("out", po::value<std::string>()->default_value("results"), "results directory")
      ("only", po::value<std::string>()->default_value(""), "comma-separated run names to run (default: all); the report keeps the other runs an earlier run left in --out")
      ("dry-run", po::bool_switch(), "print the commands of each run; start nothing")
      ("report-only", po::bool_switch(), "start nothing: write the report from the run folders earlier runs left in --out (with --only: those runs' folders, the rest as the earlier report had them)")
      ("heartbeat-timeout", po::value<double>()->default_value(10.0), "seconds before a silent process is dead")
      ("auth-dir", po::value<std::string>(), "CURVE on every socket of every run, with the keys gradsync-keygen wrote here")
      ("slurm", po::bool_switch(), "run each run as a Slurm job (srun; its tasks' files come back through srun's output)")
      ("slurm-args", po::value<std::string>()->default_value(""), "--slurm: more srun options, split on spaces (e.g. \"--partition=cpu --account=ml\")")
      ("bin-dir", po::value<std::string>(), "where gradsync-server and gradsync-worker are (default: next to this one)");
  flags.positional().add("spec", 1);
  auto vm = flags.ParseOrExit(argc, argv);
  if (!vm.count("spec")) flags.Fail("give the experiment spec: gradsync-run SPEC");
  auto e = LoadExperiment(vm["spec"].as<std::string>());
  if (!e.ok()) {
    std::cerr << "gradsync-run: error: " << e.status().message() << std::endl;
    return 2;
  }
  RunnerOptions o;
  o.out_dir = vm["out"].as<std::string>();
  o.dry_run = vm["dry-run"].as<bool>();
  o.report_only = vm["report-only"].as<bool>();
  if (o.dry_run && o.report_only) flags.Fail("--dry-run and --report-only: give one");
  o.heartbeat_timeout_s = vm["heartbeat-timeout"].as<double>();
  if (vm.count("auth-dir")) {
    o.auth_dir = std::filesystem::absolute(vm["auth-dir"].as<std::string>()).string();
    if (!std::filesystem::is_directory(o.auth_dir)) flags.Fail("--auth-dir: " + o.auth_dir + " is not a directory (gradsync-keygen DIR makes one)");
  }
  o.slurm = vm["slurm"].as<bool>();
  std::stringstream slurm_args(vm["slurm-args"].as<std::string>());
  for (std::string a; slurm_args >> a;) o.srun_args.push_back(a);
  if (!o.slurm && !o.srun_args.empty()) flags.Fail("--slurm-args applies with --slurm only");
  if (o.slurm && !o.dry_run && !OnPath("srun")) flags.Fail("--slurm: srun is not on the PATH (Debian: apt-get install slurm-client)");
  std::stringstream only(vm["only"].as<std::string>());
  for (std::string name; std::getline(only, name, ',');) {
    if (name.empty()) continue;
    bool found = false;
    for (const auto& r : e->runs) found = found || r.name == name;
    if (!found) {  // before announcing anything
      std::string names;
      for (const auto& r : e->runs) names += (names.empty() ? "" : ", ") + r.name;
      flags.Fail("--only: the spec has no run named '" + name + "' (its runs: " + names + ")");
    }
    o.only.insert(name);
  }
  o.bin_dir = vm.count("bin-dir") ? vm["bin-dir"].as<std::string>()
                                  : std::filesystem::canonical("/proc/self/exe").parent_path().string();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::cout << e->name << ": " << (o.only.empty() ? e->runs.size() : o.only.size()) << " run(s)"
            << (o.dry_run ? " (dry run)"
                : o.report_only ? ", reported from " + o.out_dir + "/" + e->name
                                : ", results in " + o.out_dir + "/" + e->name)
            << std::endl;
  Status s = RunExperiment(*e, o, std::cout, &g_interrupted);
  if (!s.ok()) {
    std::cerr << "gradsync-run: error: " << s.message() << std::endl;
    return g_interrupted ? 130 : (s.code() == StatusCode::kInvalidArgument ? 2 : 1);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
