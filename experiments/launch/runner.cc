#include "experiments/launch/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "experiments/launch/file_relay.h"
#include "experiments/launch/launcher.h"
#include "experiments/launch/netns.h"
#include "experiments/process/process.h"
#include "experiments/spec/progress.h"
#include "experiments/spec/report.h"
#include "experiments/trace/trace_merge.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;

// One run as a Slurm job (RunnerOptions::slurm): srun's output goes to logs/srun.log, the
// tasks' files come back through it, and what is left of it (the tasks' own messages) stays.
// The last line srun itself wrote to its log ("srun: job 12 queued and waiting for resources"),
// read from `offset` on; "" when none.
std::string LastSrunLine(const std::string& path, std::streamoff* offset) {
  std::ifstream f(path);
  if (!f) return "";
  f.seekg(*offset);
  std::string line, last;
  while (std::getline(f, line)) {
    if (f.eof()) break;  // a line still being written
    *offset += static_cast<std::streamoff>(line.size() + 1);
    if (line.starts_with("srun: ")) last = line;
  }
  return last;
}

Status RunOnSlurm(const std::string& experiment, const RunPlan& plan, const RunnerOptions& o, const std::string& run_dir,
                  ProgressLine& progress, const volatile bool* interrupted) {
  if (plan.run.has_link()) return FailedPreconditionError("links are emulated on one machine only: not with --slurm");
  std::error_code ec;
  fs::create_directories(run_dir + "/logs", ec);
  if (ec) return InvalidArgumentError(run_dir + ": cannot create: " + ec.message());
  const std::string stage = "/tmp/gradsync-slurm-" + experiment + "-" + plan.name + "-" + std::to_string(::getpid());
  ChildSpec srun{"srun", SlurmRunCommand(experiment, plan, o, stage), run_dir + "/logs/srun.log"};
  std::ofstream(run_dir + "/commands.txt") << JoinArgs(srun.argv) << "\n";
  ProcessGroup group;
  RETURN_IF_ERROR(group.Spawn(srun));
  // srun's own --time stops the job first; this is the backstop for a job that never started.
  std::streamoff offset = 0;
  auto tick = [&] {
    if (std::string said = LastSrunLine(srun.log_path, &offset); !said.empty()) progress.SetNote(said);
    progress.Tick();
  };
  Status status = group.WaitAll(plan.timeout_s + 300, interrupted, tick);
  progress.SetNote("");
  FileCollector files(run_dir);
  std::ifstream log(run_dir + "/logs/srun.log");
  std::string rest, srun_said;
  for (std::string line; std::getline(log, line);) {
    if (files.Line(line)) continue;
    rest += line + "\n";
    if (line.starts_with("srun: error:") || line.starts_with("srun: fatal:")) srun_said = line;
  }
  log.close();
  std::ofstream(run_dir + "/logs/srun.log") << rest;
  Status collected = files.Finish();
  if (!status.ok()) {
    return AbortedError(std::string(status.message()) + (srun_said.empty() ? "" : " (" + srun_said + ")") + "; see " +
                        run_dir + "/logs/srun.log");
  }
  return collected;
}

}  // namespace

std::vector<std::string> SlurmRunCommand(const std::string& experiment, const RunPlan& plan, const RunnerOptions& o,
                                         const std::string& stage) {
  const int tasks = plan.workers + (plan.mode == config::ALLREDUCE ? 0 : plan.servers);
  std::vector<std::string> argv = {"srun", "--job-name=gradsync-" + experiment + "-" + plan.name,
                                   "--ntasks=" + std::to_string(tasks), "--kill-on-bad-exit=1", "--label",
                                   "--time=" + std::to_string(static_cast<int>(std::ceil(plan.timeout_s / 60)) + 1)};
  // The PS modes deal the tasks to the nodes in turn: the servers (the first tasks) on different
  // nodes. All-reduce keeps Slurm's blocks: ring neighbours share a node.
  if (plan.mode != config::ALLREDUCE) argv.push_back("--distribution=cyclic");
  argv.insert(argv.end(), o.srun_args.begin(), o.srun_args.end());
  argv.insert(argv.end(), {o.bin_dir + "/gradsync-launch", "--slurm", "--mode=" + ModeName(plan.mode)});
  if (plan.mode == config::SSP) argv.push_back("--staleness=" + std::to_string(plan.staleness));
  if (plan.mode != config::ALLREDUCE) argv.push_back("--servers=" + std::to_string(plan.servers));
  argv.insert(argv.end(), {"--workers=" + std::to_string(plan.workers), "--out=" + stage, "--emit-files",
                           "--heartbeat-timeout=" + ShortestText(o.heartbeat_timeout_s),
                           "--timeout=" + ShortestText(plan.timeout_s)});
  if (!o.auth_dir.empty()) argv.push_back("--auth-dir=" + o.auth_dir);
  for (const auto& [w, flags] : plan.worker_extra) {
    for (const auto& f : flags) argv.push_back("--worker-extra=" + std::to_string(w) + ":" + f);
  }
  if (!plan.command.empty() || !plan.worker_args.empty()) argv.push_back("--");
  const auto& after = plan.command.empty() ? plan.worker_args : plan.command;
  argv.insert(argv.end(), after.begin(), after.end());
  return argv;
}

namespace {

// A traced run's timeline picture, in the experiment's folder beside the other plots.
std::string TimelineFile(const RunPlan& plan) { return "timeline-" + plan.name + ".png"; }

// With --only: the report of the runs just made, and of the spec's other runs as an earlier
// gradsync-run left them in `dir` (in the spec's order), so that running one run again does not
// drop the rest from summary.json, summary.md and the plots. An earlier run (or a selected one
// that an interruption kept from running) is read again from its folder, ended as the earlier
// summary.json says; a run that summary.json lacks, or whose folder is gone, is left out.
std::vector<RunReport> WithEarlierRuns(const Experiment& e, const std::set<std::string>& ran, const std::string& dir,
                                       std::vector<RunReport> reports) {
  auto earlier = ReadSummary(dir + "/summary.json");
  if (!earlier.ok()) return reports;
  std::vector<RunReport> all;
  for (const RunPlan& plan : e.runs) {
    if (ran.count(plan.name)) {
      auto now = std::find_if(reports.begin(), reports.end(), [&plan](const RunReport& r) { return r.summary.name() == plan.name; });
      if (now != reports.end()) {
        all.push_back(std::move(*now));
        continue;
      }
      // Selected but not run (interrupted before it): as it was.
    }
    const std::string run_dir = dir + "/" + plan.name;
    const spec::RunSummary* was = nullptr;
    for (const auto& r : earlier->run()) {
      if (r.name() == plan.name) was = &r;
    }
    std::error_code ec;
    if (was == nullptr || !fs::is_directory(run_dir, ec)) continue;
    const Status ended = was->ok() ? OkStatus() : AbortedError(was->error());
    auto report = SummarizeRun(plan, run_dir, e.target_accuracy, ended);
    if (!report.ok()) {
      RunReport kept;  // its folder no longer reads: the earlier summary's numbers, without curves
      kept.summary = *was;
      all.push_back(std::move(kept));
      continue;
    }
    const std::string png = TimelineFile(plan);
    if (plan.trace && fs::exists(dir + "/" + png, ec)) report->timeline = png;
    all.push_back(std::move(report).value());
  }
  return all;
}

}  // namespace

namespace {

// The runs --only names (every run without it), in the spec's order; an error names one it lacks.
Result<std::vector<const RunPlan*>> SelectRuns(const Experiment& e, const RunnerOptions& o) {
  for (const auto& name : o.only) {
    bool found = false;
    for (const auto& r : e.runs) found = found || r.name == name;
    if (!found) return InvalidArgumentError("--only: the spec has no run named '" + name + "'");
  }
  std::vector<const RunPlan*> selected;
  for (const auto& r : e.runs) {
    if (o.only.empty() || o.only.count(r.name)) selected.push_back(&r);
  }
  return selected;
}

LaunchOptions LaunchOptionsFor(const RunPlan& plan, const RunnerOptions& o, const std::string& run_dir) {
  LaunchOptions lo;
  lo.bin_dir = o.bin_dir;
  lo.out_dir = run_dir;
  lo.mode = plan.mode;
  lo.staleness = plan.staleness;
  lo.num_servers = plan.servers;
  lo.num_workers = plan.workers;
  lo.worker_args = plan.worker_args;
  lo.worker_extra_args = plan.worker_extra;
  lo.worker_command = plan.command;
  lo.heartbeat_timeout_s = o.heartbeat_timeout_s;
  lo.auth_dir = o.auth_dir;
  lo.timeout_s = plan.timeout_s;
  lo.worker0_to_stdout = false;
  lo.dry_run = o.dry_run;
  lo.trace = plan.trace;
  return lo;
}

// A run with a link: each process in a network namespace of its own behind an emulated link
// (*net, which the launch options' hosts refer to). Loopback without one, and with --slurm each
// process where Slurm puts it. The error of a network that could not be made.
Status EmulateLinks(const RunPlan& plan, const RunnerOptions& o, std::unique_ptr<NetworkEmulation>& net,
                    LaunchOptions& lo) {
  const int hosts = 1 + plan.servers + plan.workers;
  if (!plan.run.has_link() || o.slurm) {
    // loopback, or each process where Slurm puts it
  } else if (o.dry_run) {
    lo.host_prefix = [](int h) { return std::vector<std::string>{"ip", "netns", "exec", "<run-ns>-h" + std::to_string(h)}; };
    lo.host_address = [](int h) { return NetworkEmulation::Address(h); };
  } else {
    auto n = NetworkEmulation::Create(hosts, {plan.run.link().rate(), plan.run.link().delay_ms(), plan.run.link().congestion_control()});
    if (n.ok()) {
      net = std::move(n).value();
      lo.host_prefix = [&net](int h) { return net->Prefix(h); };
      lo.host_address = [&net](int h) { return net->Address(h); };
    } else {
      return n.status();
    }
  }
  return OkStatus();
}

// The timeline picture beside the other plots (the merged trace is in the run's folder).
void AddTimeline(const RunPlan& plan, const std::string& dir, const std::string& run_dir, const std::string& label,
                 RunReport& report, std::ostream& out) {
  const std::string png = TimelineFile(plan);
  auto trace = LoadTrace(run_dir + "/trace.json");
  Status drawn = trace.ok() ? DrawTimeline(*trace, dir + "/" + png, 4) : trace.status();
  if (drawn.ok()) {
    report.timeline = png;
  } else {
    out << "\n" << label << ": no timeline: " << drawn.message() << "\n";
  }
}

// The report's row of a run that could not be summarized.
RunReport BrokenReport(const RunPlan& plan, const Status& why) {
  RunReport broken;
  broken.summary.set_name(plan.name);
  broken.summary.set_mode(ModeName(plan.mode));
  broken.summary.set_ok(false);
  broken.summary.set_error(why.message());
  return broken;
}

// The experiment's report written into `dir` and its table printed.
Status WriteAndPrintReport(const Experiment& e, const std::vector<RunReport>& reports, const std::string& dir,
                           std::ostream& out) {
  Status written = WriteReport(e, reports, dir);
  out << "\n" << SummaryTable(reports, e.target_accuracy) << "\nsummary: " << dir << "/summary.md\n";
  out << PicturesText(reports, dir);
  return written;
}

// --report-only: the selected runs' folders summarized as they are, the others an earlier report
// kept, and the report written.
Status ReportOnly(const Experiment& e, const std::vector<const RunPlan*>& selected, const RunnerOptions& o,
                  const std::string& dir, std::ostream& out) {
  auto earlier = ReadSummary(dir + "/summary.json");
  std::vector<RunReport> reports;
  std::set<std::string> found;
  for (const RunPlan* plan : selected) {
    const std::string run_dir = dir + "/" + plan->name;
    std::error_code ec;
    if (!fs::is_directory(run_dir, ec)) continue;
    Status ended = fs::exists(ProcessSummaryPath(run_dir, "worker", 0), ec)
                       ? OkStatus()
                       : AbortedError("worker 0 wrote no end-of-run summary: the run did not end");
    if (earlier.ok()) {
      for (const auto& r : earlier->run()) {
        if (r.name() == plan->name && !r.ok()) ended = AbortedError(r.error());
      }
    }
    auto report = SummarizeRun(*plan, run_dir, e.target_accuracy, ended);
    if (report.ok() && plan->trace && fs::exists(dir + "/" + TimelineFile(*plan), ec)) report->timeline = TimelineFile(*plan);
    reports.push_back(report.ok() ? std::move(report).value() : BrokenReport(*plan, report.status()));
    found.insert(plan->name);
  }
  if (found.empty()) return NotFoundError(dir + ": no run folder of the runs to report (run them first)");
  if (!o.only.empty()) reports = WithEarlierRuns(e, found, dir, std::move(reports));
  return WriteAndPrintReport(e, reports, dir, out);
}

}  // namespace

Status RunExperiment(const Experiment& e, const RunnerOptions& o, std::ostream& out, const volatile bool* interrupted) {
  ASSIGN_OR_RETURN(const std::vector<const RunPlan*> selected, SelectRuns(e, o));
  const std::string dir = o.out_dir + "/" + e.name;
  if (o.report_only) return ReportOnly(e, selected, o, dir, out);
  std::vector<RunReport> reports;
  std::vector<std::string> failed;
  std::string last_run;
  for (size_t i = 0; i < selected.size(); ++i) {
    const RunPlan& plan = *selected[i];
    last_run = plan.name;
    const std::string run_dir = dir + "/" + plan.name;
    const std::string label = "[" + std::to_string(i + 1) + "/" + std::to_string(selected.size()) + "] " + plan.name;
    LaunchOptions lo = LaunchOptionsFor(plan, o, run_dir);
    if (plan.trace && o.slurm && !o.dry_run) {
      return InvalidArgumentError("run '" + plan.name + "': trace: true applies to local runs, not --slurm (yet)");
    }
    std::unique_ptr<NetworkEmulation> net;
    Status status = EmulateLinks(plan, o, net, lo);
    if (o.dry_run) {
      out << "# " << plan.name << (plan.link.empty() ? "" : " (link " + plan.link + ")") << "\n";
      if (o.slurm) {
        out << JoinArgs(SlurmRunCommand(e.name, plan, o, "/tmp/gradsync-slurm-" + e.name + "-" + plan.name + "-PID")) << "\n";
        continue;
      }
      Status s = LaunchPsJob(lo).status();
      if (!s.ok()) return s;
      continue;
    }
    std::error_code ec;
    fs::remove_all(run_dir, ec);  // a run's directory holds that run only
    ProgressLine progress(out, label, plan.epochs, plan.max_steps, run_dir + "/worker-0.csv");
    if (status.ok() && o.slurm) {
      status = RunOnSlurm(e.name, plan, o, run_dir, progress, interrupted);
      progress.Tick();
    } else if (status.ok()) {
      lo.on_tick = [&progress] { progress.Tick(); };
      status = LaunchPsJob(lo, interrupted).status();
      progress.Tick();
    }
    // What the links ran with, beside the commands (the report carries it into summary.json).
    if (net) std::ofstream(run_dir + "/commands.txt", std::ios::app) << "# links: " << plan.link << ", TCP congestion control " << net->congestion_control() << "\n";
    net.reset();  // tears the namespaces down before anything else happens
    progress.Done(status);
    auto report = SummarizeRun(plan, run_dir, e.target_accuracy, status);
    if (report.ok() && plan.trace) AddTimeline(plan, dir, run_dir, label, *report, out);
    if (report.ok()) {
      reports.push_back(std::move(report).value());
    } else {
      reports.push_back(BrokenReport(plan, report.status()));
      if (status.ok()) status = report.status();
    }
    if (!status.ok()) failed.push_back(plan.name);
    if (interrupted && *interrupted) break;
  }
  if (o.dry_run) return OkStatus();
  if (!o.only.empty()) reports = WithEarlierRuns(e, o.only, dir, std::move(reports));
  Status written = WriteAndPrintReport(e, reports, dir, out);
  if (interrupted && *interrupted) return AbortedError("interrupted during run '" + last_run + "'");
  if (!failed.empty()) {
    std::string names;
    for (const auto& f : failed) names += (names.empty() ? "" : ", ") + f;
    return AbortedError(std::to_string(failed.size()) + " run(s) failed: " + names + " (logs in " + dir + "/<run>/logs)");
  }
  return written;
}

}  // namespace gradsync
