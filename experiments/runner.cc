#include "experiments/runner.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/metrics.h"
#include "experiments/file_relay.h"
#include "experiments/launcher.h"
#include "experiments/netns.h"
#include "experiments/process.h"
#include "experiments/report.h"
#include "experiments/trace_merge.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;

// Follows worker 0's metrics file as it grows: the latest epoch, step and test accuracy.
class ProgressLine {
 public:
  ProgressLine(std::ostream& out, std::string label, const RunPlan& plan, std::string csv)
      : out_(out), label_(std::move(label)), plan_(plan), csv_(std::move(csv)), tty_(&out == &std::cout && ::isatty(1)) {}

  void Tick() {
    std::ifstream f(csv_);
    if (!f) return Print(false);
    f.seekg(offset_);
    std::string line;
    bool new_eval = false;
    while (std::getline(f, line)) {
      if (f.eof()) break;  // a row still being written
      offset_ += static_cast<std::streamoff>(line.size() + 1);
      const std::vector<std::string> v = SplitCsv(line);
      if (v.size() != kMetricsColumns || v[kColRun] == "run") continue;
      try {
        epoch_ = std::stod(v[kColEpoch]);
        step_ = std::stoll(v[kColStep]);
        if (!v[kColTestAccuracy].empty()) {
          accuracy_ = std::stod(v[kColTestAccuracy]);
          new_eval = true;
        }
      } catch (const std::exception&) {
      }
    }
    Print(new_eval);
  }
  // A word on the run's state shown after the numbers ("srun: job 12 queued and waiting for
  // resources"); "" for none.
  void SetNote(std::string note) {
    note_changed_ = note_changed_ || note != note_;
    note_ = std::move(note);
  }
  void Done(const Status& s) {
    if (tty_) out_ << "\r\033[K";
    out_ << label_ << "  " << (s.ok() ? "done" : "FAILED") << " in " << Elapsed() << " s";
    if (!std::isnan(accuracy_)) out_ << ", test accuracy " << Percent(accuracy_);
    if (!s.ok()) out_ << ": " << s.message();
    out_ << std::endl;
  }

 private:
  long Elapsed() const { return std::lround(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()); }
  static std::string Percent(double a) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(2);
    s << 100 * a << "%";
    return s.str();
  }
  void Print(bool new_eval) {
    // With a terminal, a line redrawn in place; without, a line per evaluation, at most one
    // every 10 s, and one for each new note.
    if (!tty_) {
      if (note_changed_ && !note_.empty()) {
        note_changed_ = false;  // a new word from srun: at once
      } else if (!new_eval || std::chrono::steady_clock::now() < next_line_) {
        return;
      }
      next_line_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    double frac = epoch_ / std::max(1, plan_.epochs);
    if (plan_.max_steps > 0) frac = std::max(frac, static_cast<double>(step_) / static_cast<double>(plan_.max_steps));
    frac = std::min(1.0, frac);
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(2);
    line << label_ << "  epoch " << epoch_ << "/" << plan_.epochs << "  step " << step_ << "  test acc "
         << (std::isnan(accuracy_) ? std::string("—") : Percent(accuracy_)) << "  " << Elapsed() << " s elapsed";
    if (frac > 0.02) line << ", ~" << std::lround(Elapsed() * (1 - frac) / frac) << " s left";
    if (!note_.empty()) line << "  (" << note_ << ")";
    if (tty_) out_ << "\r\033[K" << line.str() << std::flush;
    else out_ << line.str() << std::endl;
  }

  std::ostream& out_;
  std::string label_;
  const RunPlan& plan_;
  std::string csv_;
  bool tty_;
  std::streamoff offset_ = 0;
  double epoch_ = 0;
  int64_t step_ = 0;
  double accuracy_ = NAN;
  std::string note_;
  bool note_changed_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point next_line_ = start_;
};

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

Status RunExperiment(const Experiment& e, const RunnerOptions& o, std::ostream& out, const volatile bool* interrupted) {
  for (const auto& name : o.only) {
    bool found = false;
    for (const auto& r : e.runs) found = found || r.name == name;
    if (!found) return InvalidArgumentError("--only: the spec has no run named '" + name + "'");
  }
  std::vector<const RunPlan*> selected;
  for (const auto& r : e.runs) {
    if (o.only.empty() || o.only.count(r.name)) selected.push_back(&r);
  }
  const std::string dir = o.out_dir + "/" + e.name;
  std::vector<RunReport> reports;
  std::vector<std::string> failed;
  std::string last_run;
  for (size_t i = 0; i < selected.size(); ++i) {
    const RunPlan& plan = *selected[i];
    last_run = plan.name;
    const std::string run_dir = dir + "/" + plan.name;
    const std::string label = "[" + std::to_string(i + 1) + "/" + std::to_string(selected.size()) + "] " + plan.name;
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
    if (plan.trace && o.slurm && !o.dry_run) {
      return InvalidArgumentError("run '" + plan.name + "': trace: true applies to local runs, not --slurm (yet)");
    }
    const int hosts = 1 + plan.servers + plan.workers;
    std::unique_ptr<NetworkEmulation> net;
    Status status;
    if (!plan.run.has_link() || o.slurm) {
      // loopback, or each process where Slurm puts it
    } else if (o.dry_run) {
      lo.host_prefix = [](int h) { return std::vector<std::string>{"ip", "netns", "exec", "<run-ns>-h" + std::to_string(h)}; };
      lo.host_address = [](int h) { return NetworkEmulation::Address(h); };
    } else {
      auto n = NetworkEmulation::Create(hosts, {plan.run.link().rate(), plan.run.link().delay_ms()});
      if (n.ok()) {
        net = std::move(n).value();
        lo.host_prefix = [&net](int h) { return net->Prefix(h); };
        lo.host_address = [&net](int h) { return net->Address(h); };
      } else {
        status = n.status();
      }
    }
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
    ProgressLine progress(out, label, plan, run_dir + "/worker-0.csv");
    if (status.ok() && o.slurm) {
      status = RunOnSlurm(e.name, plan, o, run_dir, progress, interrupted);
      progress.Tick();
    } else if (status.ok()) {
      lo.on_tick = [&progress] { progress.Tick(); };
      status = LaunchPsJob(lo, interrupted).status();
      progress.Tick();
    }
    net.reset();  // tears the namespaces down before anything else happens
    progress.Done(status);
    auto report = SummarizeRun(plan, run_dir, e.target_accuracy, status);
    if (report.ok() && plan.trace) {
      // The timeline picture beside the other plots (the merged trace is in the run's folder).
      const std::string png = "timeline-" + plan.name + ".png";
      auto trace = LoadTrace(run_dir + "/trace.json");
      Status drawn = trace.ok() ? DrawTimeline(*trace, dir + "/" + png, 4) : trace.status();
      if (drawn.ok()) {
        report->timeline = png;
      } else {
        out << "\n" << label << ": no timeline: " << drawn.message() << "\n";
      }
    }
    if (report.ok()) {
      reports.push_back(std::move(report).value());
    } else {
      RunReport broken;
      broken.summary.set_name(plan.name);
      broken.summary.set_mode(ModeName(plan.mode));
      broken.summary.set_ok(false);
      broken.summary.set_error(report.status().message());
      reports.push_back(broken);
      if (status.ok()) status = report.status();
    }
    if (!status.ok()) failed.push_back(plan.name);
    if (interrupted && *interrupted) break;
  }
  if (o.dry_run) return OkStatus();
  Status written = WriteReport(e, reports, dir);
  out << "\n" << SummaryTable(reports, e.target_accuracy) << "\nsummary: " << dir << "/summary.md\n";
  if (interrupted && *interrupted) return AbortedError("interrupted during run '" + last_run + "'");
  if (!failed.empty()) {
    std::string names;
    for (const auto& f : failed) names += (names.empty() ? "" : ", ") + f;
    return AbortedError(std::to_string(failed.size()) + " run(s) failed: " + names + " (logs in " + dir + "/<run>/logs)");
  }
  return written;
}

}  // namespace gradsync
