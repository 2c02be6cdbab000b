// gradsync-sim SPEC: the spec's runs simulated (experiments/sim/sim.h), reported as gradsync-run
// reports real runs, marked simulated; --compare sets them beside a real run of the same spec.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "common/config/flags.h"
#include "common/obs/metrics.h"
#include "experiments/sim/sim.h"
#include "experiments/spec/report.h"
#include "experiments/spec/spec.h"

namespace po = boost::program_options;
using namespace gradsync;

namespace {

// A --workers / --servers list ("" when not given).
Result<std::vector<int>> ParseCounts(const std::string& flag, const std::string& text) {
  if (text.empty()) return std::vector<int>{};
  auto list = ParseIntList(text, 1, 100000);
  if (!list.ok()) return InvalidArgumentError("--" + flag + ": " + list.status().message());
  return std::vector<int>(list->begin(), list->end());
}

// One simulated run of a sweep: its base run, size and throughput, and what one worker computes
// alone (samples/s, from its compute time).
struct SweepPoint {
  std::string base;
  int workers = 0, servers = 0;
  double samples_per_s = 0, alone = 0;
};

// Markdown tables of a sweep: per base run and worker count the throughput and the scaling
// efficiency (throughput / (workers x one worker's compute-only throughput)); with several server
// counts, the fewest servers within 5% of the best; for runs named ...dense... with a ...topk...
// twin, top-k's throughput over dense's. "" when nothing was swept.
using ByServers = std::map<int, const SweepPoint*>;  // servers -> point

// A table row's cells, one per worker count: `cell(workers, points by servers)`, empty where the
// run has no point.
template <typename Cell>
std::string Cells(const std::map<int, ByServers>& by_workers, const std::set<int>& worker_counts, Cell cell) {
  std::string row;
  for (int n : worker_counts) {
    auto it = by_workers.find(n);
    row += (it == by_workers.end() ? std::string() : " " + cell(n, it->second)) + " |";
  }
  return row;
}

using Sweep = std::map<std::string, std::map<int, ByServers>>;  // base -> workers -> servers

// Throughput per worker count at the best server count, and the scaling efficiency.
void ScalingTable(const Sweep& by, const std::set<int>& worker_counts, const std::string& columns,
                  std::ostringstream& o) {
  o << "## Scaling (simulated)\n\nsamples/s, and in brackets the scaling efficiency: samples/s / (workers x one worker's "
       "compute-only samples/s). PS runs: at their best server count.\n\n| run |";
  o << columns;
  for (const auto& [base, ns] : by) {
    o << "| " << base << " |" << Cells(ns, worker_counts, [](int n, const ByServers& at) {
      const SweepPoint* best = nullptr;
      for (const auto& [sv, p] : at)
        if (!best || p->samples_per_s > best->samples_per_s) best = p;
      return Fixed(best->samples_per_s, 0) + (best->alone > 0 ? " (" + Fixed(100 * best->samples_per_s / (n * best->alone), 0) + "%)" : "");
    }) << "\n";
  }
}

// The fewest servers within 5% of the best, per PS run and worker count.
void ServersTable(const Sweep& by, const std::set<int>& worker_counts, const std::string& columns,
                  std::ostringstream& o) {
  o << "\n## Servers a PS needs (simulated)\n\nThe fewest servers whose throughput is within 5% of the best over "
       "the server counts simulated (the PS stops being the bottleneck there), and that throughput; +: the most "
       "servers simulated, where more may still help.\n\n| run |";
  o << columns;
  for (const auto& [base, ns] : by) {
    if (ns.begin()->second.begin()->first == 0) continue;  // all-reduce
    o << "| " << base << " |" << Cells(ns, worker_counts, [](int, const ByServers& at) {
      double best = 0;
      for (const auto& [sv, p] : at) best = std::max(best, p->samples_per_s);
      for (const auto& [sv, p] : at) {
        // "+": the most servers simulated; more might still help.
        if (p->samples_per_s >= 0.95 * best) return std::to_string(sv) + (sv == at.rbegin()->first ? "+" : "") + " (" + Fixed(p->samples_per_s, 0) + ")";
      }
      return std::string();
    }) << "\n";
  }
}

// The rows of top-k against dense: at the best server count of each, or, with `per_count` (the
// servers were swept), at each server count. "" when no run named ...dense... has a ...topk... twin.
std::string TopkRows(const Sweep& by, const std::set<int>& worker_counts, const std::set<int>& server_counts,
                     bool per_count) {
  std::ostringstream pays;
  for (const auto& [base, ns] : by) {
    const size_t at = base.find("dense");
    if (at == std::string::npos) continue;
    const std::string twin = base.substr(0, at) + "topk" + base.substr(at + 5);
    auto t = by.find(twin);
    if (t == by.end()) continue;
    const bool ps = ns.begin()->second.begin()->first > 0;
    const std::vector<int> rows = per_count && ps ? std::vector<int>(server_counts.begin(), server_counts.end()) : std::vector<int>{-1};
    for (int sv : rows) {
      pays << "| " << twin << " / " << base << (sv > 0 ? ", " + std::to_string(sv) + " servers" : "") << " |";
      for (int n : worker_counts) {
        auto a = ns.find(n);
        auto b = t->second.find(n);
        double da = 0, db = 0;
        if (a != ns.end() && b != t->second.end()) {
          for (const auto& [k, p] : a->second) da = sv < 0 ? std::max(da, p->samples_per_s) : k == sv ? p->samples_per_s : da;
          for (const auto& [k, p] : b->second) db = sv < 0 ? std::max(db, p->samples_per_s) : k == sv ? p->samples_per_s : db;
        }
        pays << (da > 0 && db > 0 ? " " + Fixed(db / da, 2) + "x |" : " |");
      }
      pays << "\n";
    }
  }
  return pays.str();
}

std::string SweepTables(const std::vector<SweepPoint>& points) {
  Sweep by;
  std::set<int> worker_counts, server_counts;
  for (const auto& p : points) {
    by[p.base][p.workers][p.servers] = &p;
    worker_counts.insert(p.workers);
    if (p.servers > 0) server_counts.insert(p.servers);
  }
  // Servers were swept when some run at some worker count ran at several server counts.
  bool servers_swept = false;
  for (const auto& [base, ns] : by)
    for (const auto& [n, ss] : ns) servers_swept = servers_swept || ss.size() > 1;
  // The worker counts as columns, and the header's rule.
  std::string columns;
  for (int n : worker_counts) columns += " " + std::to_string(n) + " workers |";
  columns += "\n|---|";
  for (size_t i = 0; i < worker_counts.size(); ++i) columns += "---|";
  columns += "\n";
  std::ostringstream o;
  if (worker_counts.size() > 1 || servers_swept) ScalingTable(by, worker_counts, columns, o);
  if (servers_swept) ServersTable(by, worker_counts, columns, o);
  const bool per_count = servers_swept;
  const std::string pays = TopkRows(by, worker_counts, server_counts, per_count);
  if (!pays.empty() && (worker_counts.size() > 1 || servers_swept)) {
    o << "\n## Where top-k pays (simulated)\n\nTop-k's throughput over the dense run's (" << (per_count ? "PS: at each server count" : "PS: each at its best server count")
      << "): above 1, top-k moves the steps faster (what it costs in accuracy per step is measured, not simulated).\n\n| runs |";
    o << columns << pays;
  }
  return o.str();
}

// The command line, checked beyond its types (FlagParser::Fail exits on a bad flag).
struct SimFlags {
  double step_tol = 0, bytes_tol = 0;
  std::vector<int> workers, servers;  // empty: the spec's counts
  int per_server = 0;
  std::set<std::string> only;  // empty: every run
  std::string link_rate;
};

void DeclareFlags(FlagParser& flags) {
  flags.options().add_options()
      ("spec", po::value<std::string>(), "the experiment spec (protobuf text; a run's sim { } says how it is simulated)")
      ("out", po::value<std::string>()->default_value("results-sim"), "results go to OUT/<experiment>/")
      ("only", po::value<std::string>()->default_value(""), "comma-separated run names to simulate (default: all)")
      ("workers", po::value<std::string>()->default_value(""), "simulate each run at each of these worker counts (8,64,1024), as <run>-n<W>")
      ("servers", po::value<std::string>()->default_value(""), "PS runs: at each of these server counts, as <run>-s<S>")
      ("workers-per-server", po::value<int>()->default_value(0), "PS runs: one server per this many workers (rounded up), instead of the spec's servers")
      ("link-rate", po::value<std::string>()->default_value(""), "every host's link (tc rate: 25gbit), instead of the spec's")
      ("compute-ms", po::value<double>(), "forward + backward per step, instead of the spec's")
      ("steps", po::value<int64_t>(), "steps per worker, instead of the spec's")
      ("compare", po::value<std::string>(), "a folder gradsync-run wrote for this spec (OUT/<experiment>), or several, comma-separated (each run against their median): predicted vs measured step time and bytes per step")
      ("step-tolerance", po::value<double>()->default_value(0.15, "0.15"), "--compare: the largest relative step time error accepted")
      ("bytes-tolerance", po::value<double>()->default_value(0.01, "0.01"), "--compare: the largest relative bytes/step error accepted");
  flags.positional().add("spec", 1);
}

SimFlags CheckFlags(const FlagParser& flags, const po::variables_map& vm, const Experiment& e) {
  SimFlags f;
  f.step_tol = vm["step-tolerance"].as<double>(), f.bytes_tol = vm["bytes-tolerance"].as<double>();
  if (!(f.step_tol > 0) || !(f.bytes_tol > 0)) flags.Fail("--step-tolerance and --bytes-tolerance must be > 0");
  auto workers = ParseCounts("workers", vm["workers"].as<std::string>());
  if (!workers.ok()) flags.Fail(workers.status().message());
  auto servers = ParseCounts("servers", vm["servers"].as<std::string>());
  if (!servers.ok()) flags.Fail(servers.status().message());
  f.workers = *workers, f.servers = *servers;
  f.per_server = vm["workers-per-server"].as<int>();
  if (f.per_server < 0) flags.Fail("--workers-per-server must be >= 1");
  if (f.per_server > 0 && !f.servers.empty()) flags.Fail("--workers-per-server and --servers contradict each other: give one");
  std::stringstream in(vm["only"].as<std::string>());
  for (std::string name; std::getline(in, name, ',');) {
    if (name.empty()) continue;
    bool found = false;
    for (const auto& r : e.runs) found = found || r.name == name;
    if (!found) flags.Fail("--only: the spec has no run named '" + name + "'");
    f.only.insert(name);
  }
  f.link_rate = vm["link-rate"].as<std::string>();
  return f;
}

// Where a simulated run comes from: its base run in the spec, and its size.
struct Origin {
  std::string base;
  int workers = 0, servers = 0;
};

// The runs to simulate: each selected run at each worker and server count asked for (*origins:
// one per plan).
std::vector<RunPlan> PlanRuns(const Experiment& e, const SimFlags& f, const po::variables_map& vm,
                              std::vector<Origin>* origins) {
  std::vector<RunPlan> plans;
  for (const RunPlan& base : e.runs) {
    if (!f.only.empty() && !f.only.count(base.name)) continue;
    const std::vector<int> ns = f.workers.empty() ? std::vector<int>{base.workers} : f.workers;
    const bool ps = base.mode != config::ALLREDUCE;
    const std::vector<int> ss = f.servers.empty() || !ps ? std::vector<int>{base.servers} : f.servers;
    for (int n : ns) {
      const std::vector<int> counts = f.per_server > 0 && ps ? std::vector<int>{(n + f.per_server - 1) / f.per_server} : ss;
      for (int s : counts) {
        RunPlan p = base;
        p.workers = n;
        p.run.set_workers(n);
        p.servers = s;
        p.run.set_servers(s);
        if (!f.workers.empty()) p.name += "-n" + std::to_string(n);
        if (!f.servers.empty() && ps) p.name += "-s" + std::to_string(s);
        // Stragglers of workers this run lacks are dropped.
        for (auto it = p.stragglers.begin(); it != p.stragglers.end();) it = it->first >= n ? p.stragglers.erase(it) : std::next(it);
        if (!f.link_rate.empty()) p.run.mutable_sim()->set_link_rate(f.link_rate);
        if (vm.count("compute-ms")) p.run.mutable_sim()->set_compute_ms(vm["compute-ms"].as<double>());
        if (vm.count("steps")) p.run.mutable_sim()->set_steps(vm["steps"].as<int64_t>());
        if (!p.run.sim().link_rate().empty()) p.link = p.run.sim().link_rate();
        origins->push_back({base.name, n, ps ? s : 0});
        plans.push_back(std::move(p));
      }
    }
  }
  return plans;
}

// The line (and the notes under it) a simulated run prints: `i` of `total`.
void PrintRun(size_t i, size_t total, const RunPlan& p, const SimStats& stats) {
  std::cout << "[" << i + 1 << "/" << total << "] " << p.name << "  " << Fixed(stats.simulated_s, 2) << " s simulated in "
            << Fixed(stats.elapsed_s, 2) << " s: " << stats.worker_steps << " worker-steps, "
            << Fixed(static_cast<double>(stats.simulated_worker_steps) / std::max(1e-9, stats.elapsed_s), 0) << " worker-steps/s, " << stats.events
            << " events" << std::endl;
  if (!stats.draws.empty()) std::cout << "    " << stats.draws << std::endl;
  if (!stats.codecs.empty()) std::cout << "    measured here: " << stats.codecs << std::endl;
  if (stats.worker_steps > 0) {
    // Per step of the whole job (every worker one step), as bench/cpu_per_step.py measures it.
    const double per = 1e3 * p.workers / static_cast<double>(stats.worker_steps);
    std::cout << "    CPU modelled per step: " << Fixed((stats.worker_cpu_s + stats.server_cpu_s + stats.kernel_cpu_s) * per, 2)
              << " core-ms (workers " << Fixed(stats.worker_cpu_s * per, 2) << ", servers " << Fixed(stats.server_cpu_s * per, 2)
              << ", kernel " << Fixed(stats.kernel_cpu_s * per, 2) << ")" << std::endl;
  }
}

// What simulating the plans gave.
struct Simulated {
  std::vector<RunReport> reports;
  std::vector<SweepPoint> points;  // for the sweep tables
  bool failed = false;             // some run failed
  double speed_steps = 0, speed_s = 0;  // worker-steps simulated, and the seconds that took
};

// Simulates each plan into DIR/<run>/ and summarizes it. 0, else the exit code of an error that
// stops everything.
int SimulateRuns(const Experiment& e, const std::vector<RunPlan>& plans, const std::vector<Origin>& origins,
                 const std::string& dir, Simulated* out) {
  for (size_t i = 0; i < plans.size(); ++i) {
    const RunPlan& p = plans[i];
    const std::string run_dir = dir + "/" + p.name;
    std::filesystem::remove_all(run_dir);
    auto settings = ResolveSim(p);
    if (!settings.ok()) {
      std::cerr << "gradsync-sim: error: run '" << p.name << "': " << settings.status().message() << std::endl;
      return 2;
    }
    const double alone = settings->compute_ms > 0 ? static_cast<double>(p.batch) * 1e3 / settings->compute_ms : 0;
    auto stats = SimulateRun(p, *settings, run_dir);
    Status status = stats.ok() ? OkStatus() : stats.status();
    if (stats.ok()) {
      PrintRun(i, plans.size(), p, *stats);
      out->speed_steps += static_cast<double>(stats->simulated_worker_steps);
      out->speed_s += stats->elapsed_s;
    } else {
      std::cout << "[" << i + 1 << "/" << plans.size() << "] " << p.name << "  FAILED: " << status.message() << std::endl;
      out->failed = true;
    }
    auto report = SummarizeRun(p, run_dir, e.target_accuracy, status);
    if (!report.ok()) {
      std::cerr << "gradsync-sim: error: " << report.status().message() << std::endl;
      return 1;
    }
    report->summary.set_simulated(true);
    report->summary.set_simulation(DescribeSim(p, *settings) + (stats.ok() && !stats->draws.empty() ? "; " + stats->draws : "") +
                                   (stats.ok() && !stats->codecs.empty() ? "; " + stats->codecs : ""));
    if (report->summary.ok() && report->summary.has_samples_per_s()) {
      out->points.push_back({origins[i].base, origins[i].workers, origins[i].servers, report->summary.samples_per_s(), alone});
    }
    out->reports.push_back(std::move(*report));
  }
  return 0;
}

// DIR/summary.md and the summary on stdout, with the sweep's tables. 0, else the exit code.
int ReportRuns(const Experiment& e, const Simulated& sim, const std::string& dir) {
  if (auto st = WriteReport(e, sim.reports, dir); !st.ok()) {
    std::cerr << "gradsync-sim: error: " << st.message() << std::endl;
    return 1;
  }
  std::cout << "\n" << SummaryTable(sim.reports, e.target_accuracy);
  // Sweeps: scaling per worker count, the servers a PS needs, where top-k pays.
  const std::string sweeps = SweepTables(sim.points);
  if (!sweeps.empty()) {
    std::ofstream(dir + "/summary.md", std::ios::app) << "\n" << sweeps;
    std::cout << "\n" << sweeps;
  }
  std::cout << "\nsummary: " << dir << "/summary.md\n" << PicturesText(sim.reports, dir) << std::flush;
  if (sim.speed_s > 0) {
    std::cout << "simulator: " << Fixed(sim.speed_steps / sim.speed_s, 0) << " worker-steps/s over these runs" << std::endl;
  }
  return 0;
}

// --compare's folders and their summaries. 0, else the exit code.
int ReadMeasured(const std::string& compare, std::vector<std::string>* measured_dirs,
                 std::vector<spec::Summary>* measured) {
  for (auto& d : SplitCsv(compare))
    if (!d.empty()) measured_dirs->push_back(std::move(d));
  for (const auto& d : *measured_dirs) {
    auto m = ReadSummary(d + "/summary.json");
    if (!m.ok()) {
      std::cerr << "gradsync-sim: error: " << m.status().message()
                << (m.status().code() == StatusCode::kNotFound ? " (--compare needs the folder gradsync-run wrote for this spec)" : "") << std::endl;
      return 2;
    }
    measured->push_back(std::move(m).value());
  }
  if (measured->empty()) {
    std::cerr << "gradsync-sim: error: --compare names no folder" << std::endl;
    return 2;
  }
  return 0;
}

// How the simulated runs compare with the measured ones.
struct Tally {
  int compared = 0, outside = 0, step_outside = 0, bytes_outside = 0;
};

// One row of the comparison: the run's simulated step time and bytes per step against the median
// of its measurements.
void CompareRow(const RunReport& r, const std::vector<spec::Summary>& measured, double step_tol, double bytes_tol,
                std::ostringstream& t, Tally* tally) {
  const bool repeated = measured.size() > 1;
  std::vector<double> steps, bytes;
  std::string link;
  for (const auto& summary : measured) {
    for (const auto& run : summary.run()) {
      if (run.name() != r.summary.name() || !run.ok() || !run.has_step_ms() || !run.has_bytes_per_step()) continue;
      steps.push_back(run.step_ms());
      bytes.push_back(run.bytes_per_step());
      link = run.link();
    }
  }
  if (steps.empty()) {
    t << "| " << r.summary.name() << " | | | | not measured | " << (repeated ? "| " : "") << "| | | | |\n";
    return;
  }
  const double step_ms = Median(steps), bytes_per_step = Median(bytes);
  const double se = r.summary.step_ms() / step_ms - 1;
  // A run that moved nothing (one worker alone) has no bytes to compare.
  const bool moved = bytes_per_step > 0;
  const double be = moved ? r.summary.bytes_per_step() / bytes_per_step - 1 : 0;
  const bool step_ok = std::fabs(se) <= step_tol, bytes_ok = std::fabs(be) <= bytes_tol;
  ++tally->compared;
  tally->outside += step_ok && bytes_ok ? 0 : 1;
  tally->step_outside += step_ok ? 0 : 1;
  tally->bytes_outside += bytes_ok ? 0 : 1;
  t << "| " << r.summary.name() << " | " << r.summary.mode() << (r.summary.has_staleness_bound() ? std::to_string(r.summary.staleness_bound()) : "")
    << (r.summary.compression() == "none" ? "" : " " + r.summary.compression()) << " | " << (link.empty() ? "loopback" : link) << " | "
    << r.summary.workers() << " | " << Fixed(step_ms, 2) << " | ";
  if (repeated) {
    const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
    t << Fixed(*lo, 2) << "–" << Fixed(*hi, 2) << (steps.size() < measured.size() ? " (" + std::to_string(steps.size()) + " of " + std::to_string(measured.size()) + ")" : "") << " | ";
  }
  t << Fixed(r.summary.step_ms(), 2) << " | " << (se >= 0 ? "+" : "")
    << Fixed(100 * se, 1) << "%" << (step_ok ? "" : " **outside**") << " | " << Fixed(bytes_per_step, 0) << " | "
    << Fixed(r.summary.bytes_per_step(), 0) << " | ";
  if (moved) t << (be >= 0 ? "+" : "") << Fixed(100 * be, 2) << "%" << (bytes_ok ? "" : " **outside**");
  else t << "—";
  t << " |\n";
}

// --compare: predicted vs measured, with several measurements of the spec against each run's
// median; DIR/comparison.md. The exit code.
int CompareWithMeasured(const Experiment& e, const std::vector<RunReport>& reports, const SimFlags& f,
                        const std::string& compare, const std::string& dir) {
  std::vector<std::string> measured_dirs;
  std::vector<spec::Summary> measured;
  if (int code = ReadMeasured(compare, &measured_dirs, &measured); code != 0) return code;
  const bool repeated = measured.size() > 1;

  std::ostringstream t;
  t << "| run | mode | link | workers | step ms measured | " << (repeated ? "measured min–max | " : "")
    << "predicted | error | bytes/step measured | predicted | error |\n|---|---|---|---|---|" << (repeated ? "---|" : "")
    << "---|---|---|---|---|\n";
  Tally tally;
  for (const auto& r : reports) CompareRow(r, measured, f.step_tol, f.bytes_tol, t, &tally);
  std::string measured_text;
  for (const auto& d : measured_dirs) measured_text += (measured_text.empty() ? "`" : ", `") + d + "/summary.json`";
  if (repeated) measured_text += " (" + std::to_string(measured_dirs.size()) + " measurements; each run against their median)";
  std::ofstream(dir + "/comparison.md") << "# " << e.name << ": simulated vs measured\n\nMeasured: " << measured_text
                                        << "; tolerances: step time " << Fixed(100 * f.step_tol, 0) << "%, bytes/step "
                                        << Fixed(100 * f.bytes_tol, 0) << "%.\n\n" << t.str();
  std::cout << "\n" << t.str() << "\n" << tally.compared << " runs compared, " << tally.outside
            << " outside the tolerances: " << tally.step_outside << " by step time (" << Fixed(100 * f.step_tol, 0)
            << "%), " << tally.bytes_outside << " by bytes/step (" << Fixed(100 * f.bytes_tol, 0) << "%): " << dir
            << "/comparison.md" << std::endl;
  return tally.outside == 0 && tally.compared > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("gradsync-sim",
                   "Simulates each run of the experiment SPEC at any scale (discrete events: links, racks, CPUs,\n"
                   "the servers' own consistency rule, the all-reduce algorithms, codecs) and writes\n"
                   "OUT/<experiment>/ as gradsync-run does, marked simulated (experiments/README.md).",
                   "gradsync-sim SPEC [options]");
  DeclareFlags(flags);
  auto vm = flags.ParseOrExit(argc, argv);
  if (!vm.count("spec")) flags.Fail("give the experiment spec: gradsync-sim SPEC");
  auto e = LoadExperiment(vm["spec"].as<std::string>());
  if (!e.ok()) {
    std::cerr << "gradsync-sim: error: " << e.status().message() << std::endl;
    return 2;
  }
  const SimFlags f = CheckFlags(flags, vm, *e);
  std::vector<Origin> origins;  // per plan
  const std::vector<RunPlan> plans = PlanRuns(*e, f, vm, &origins);
  const std::string dir = vm["out"].as<std::string>() + "/" + e->name;
  Simulated sim;
  if (int code = SimulateRuns(*e, plans, origins, dir, &sim); code != 0) return code;
  if (int code = ReportRuns(*e, sim, dir); code != 0) return code;
  if (sim.failed) return 1;
  if (!vm.count("compare")) return 0;
  return CompareWithMeasured(*e, sim.reports, f, vm["compare"].as<std::string>(), dir);
}
