#include "experiments/spec/report.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "experiments/process/process.h"

namespace gradsync {

std::string Fixed(double v, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

namespace fs = std::filesystem;

std::string Trimmed(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string Thousands(double v) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(v)));
  std::string out;
  int n = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return out;
}

namespace {

// What the workers' metrics files add up to.
struct MergedMetrics {
  bool any = false;      // a row was read
  int64_t steps0 = 0;    // worker 0's last step
  int64_t skipped0 = -1; // worker 0's last skipped_steps (fp16); -1: none written
  double bytes = 0;      // each worker's last bytes sent + received (wire and shared memory), summed
  double shm_bytes = 0;  // of those, through shared memory
  double steps = 0;      // each worker's last step, summed
  double comm_ms = 0, hidden_ms = 0;  // over the training rows
  std::vector<EvalPoint> evals;       // worker 0's evaluation rows
  std::vector<double> step_ms;        // per worker with two training rows: its time per step
  TrainingRowTotals totals;           // over every worker's training rows (the report's parts read them)
};

// Reads run_dir's worker-<w>.csv files and writes their rows, in worker order, to
// run_dir/metrics.csv. A row cut short by a killed process is skipped; a row that does not
// parse is an error.
Result<MergedMetrics> MergeWorkerMetrics(const RunPlan& plan, const std::string& run_dir) {
  MergedMetrics m;
  std::ofstream merged(run_dir + "/metrics.csv");
  merged << MetricsWriter::kHeader << "\n";
  for (int w = 0; w < plan.workers; ++w) {
    const std::string path = run_dir + "/worker-" + std::to_string(w) + ".csv";
    std::ifstream f(path);
    if (!f) continue;
    std::string line;
    std::getline(f, line);
    if (line != MetricsWriter::kHeader) return DataLossError(path + ": unexpected header '" + line + "'");
    int64_t last_step = 0;
    double last_bytes = 0, last_shm = 0;
    std::vector<std::pair<int64_t, double>> rows;  // training rows: step, wall_s
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      auto v = SplitCsv(line);
      if (v.size() != kMetricsColumns) continue;  // a row cut short by a killed process
      merged << line << "\n";
      m.any = true;
      try {
        const int64_t step = std::stoll(v[kColStep]);
        if (step >= last_step) {
          last_step = step;
          last_bytes = std::stod(v[kColBytesSent]) + std::stod(v[kColBytesReceived]);
          last_shm = std::stod(v[kColShmBytesSent]) + std::stod(v[kColShmBytesReceived]);
          if (w == 0 && v[kColTestAccuracy].empty() && !v[kColLossScale].empty()) m.skipped0 = std::stoll(v[kColSkippedSteps]);
        }
        if (v[kColTestAccuracy].empty()) {
          m.comm_ms += std::stod(v[kColComm]);
          m.hidden_ms += std::stod(v[kColHidden]);
          // A second row of the same step (a simulated evaluation without accuracy) keeps the first's time.
          if (rows.empty() || rows.back().first != step) {
            rows.emplace_back(step, std::stod(v[kColWall]));
            m.totals.rows += 1;
            m.totals.table_rows += std::stod(v[kColTableRows]);
          }
        }
        if (w == 0 && !v[kColTestAccuracy].empty()) {
          m.evals.push_back({step, std::stod(v[kColEpoch]), std::stod(v[kColWall]), std::stod(v[kColTestAccuracy]),
                             v[kColTestAuc].empty() ? NAN : std::stod(v[kColTestAuc])});
        }
      } catch (const std::exception&) {
        return DataLossError(path + ": a row does not parse: " + line);
      }
    }
    if (w == 0) m.steps0 = last_step;
    if (const double ms = StepMs(rows); !std::isnan(ms)) m.step_ms.push_back(ms);
    m.bytes += last_bytes + last_shm;
    m.shm_bytes += last_shm;
    m.steps += static_cast<double>(last_step);
  }
  return m;
}

}  // namespace

double StepMs(const std::vector<std::pair<int64_t, double>>& rows) {
  if (rows.size() < 2) return NAN;
  const int64_t from = rows.back().first / 10;
  for (const auto& [step, wall] : rows) {
    if (step < from) continue;
    if (step >= rows.back().first) return NAN;
    return 1e3 * (rows.back().second - wall) / static_cast<double>(rows.back().first - step);
  }
  return NAN;
}

namespace {

// What the plan says of the run, how it ended, and the commands it ran (run_dir/commands.txt).
void DescribeRun(const RunPlan& plan, const std::string& run_dir, const Status& status, spec::RunSummary& s) {
  s.set_name(plan.name);
  s.set_mode(ModeName(plan.mode));
  if (plan.mode == config::SSP) s.set_staleness_bound(plan.staleness);
  s.set_compression(plan.compression);
  s.set_precision(plan.precision);
  s.set_workers(plan.workers);
  s.set_servers(plan.servers);
  s.set_batch(plan.batch);
  s.set_model(plan.run.train().model());
  s.set_link(plan.link);
  s.set_straggler(plan.straggler);
  if (const config::TrainConfig& c = plan.run.train(); c.sync_every() > 0) {
    s.set_sync_every(c.sync_every());
    s.set_outer(OuterName(c));
  }
  s.set_ok(status.ok());
  if (!status.ok()) s.set_error(status.message());
  std::ifstream cmds(run_dir + "/commands.txt");
  std::string line;
  while (std::getline(cmds, line)) s.add_commands(line);
}

// The shards' histograms, and the model size from worker 0's summary. A process killed before
// its end wrote none (the run failed then); a file that does not parse is an error.
Status ReadProcessSummaries(const RunPlan& plan, const std::string& run_dir, RunReport& r) {
  for (int k = 0; k < plan.servers; ++k) {
    auto ps = ReadProcessSummary(ProcessSummaryPath(run_dir, "server", k));
    if (!ps.ok()) {
      if (ps.status().code() == StatusCode::kNotFound) continue;
      return ps.status();
    }
    AddHistogram(ps->version_lag(), &r.version_lag);
    AddHistogram(ps->clock_staleness(), &r.clock_staleness);
  }
  if (auto w0 = ReadProcessSummary(ProcessSummaryPath(run_dir, "worker", 0)); w0.ok()) {
    if (w0->params() > 0) r.summary.set_params(w0->params());
  } else if (w0.status().code() != StatusCode::kNotFound) {
    return w0.status();
  }
  return OkStatus();
}

// What follows from the numbers read: the bytes a step would move by the formula (uncompressed
// runs), and the histograms' quantiles.
void SetDerivedNumbers(const RunPlan& plan, RunReport& r) {
  spec::RunSummary& s = r.summary;
  if (s.has_params() && plan.compression == "none") {
    const double p4 = 4.0 * static_cast<double>(s.params());
    const double n = plan.workers;
    const double exchange = plan.mode == config::ALLREDUCE ? 2 * 2 * (n - 1) / n * p4 : 2 * p4;
    // Rounds of H steps exchange once a round: ceil(steps / H) exchanges over the steps.
    const int64_t h = s.sync_every();
    const double share = h > 0 && s.steps() > 0
                             ? static_cast<double>((s.steps() + h - 1) / h) / static_cast<double>(s.steps())
                             : 1.0;
    s.set_formula_bytes_per_step(exchange * share);
  }
  if (!r.version_lag.empty()) {
    s.set_version_lag_p50(HistogramQuantile(r.version_lag, 0.5));
    s.set_version_lag_p99(HistogramQuantile(r.version_lag, 0.99));
    s.set_version_lag_max(r.version_lag.rbegin()->first);
  }
  if (!r.clock_staleness.empty()) {
    s.set_clock_staleness_p50(HistogramQuantile(r.clock_staleness, 0.5));
    s.set_clock_staleness_p99(HistogramQuantile(r.clock_staleness, 0.99));
    s.set_clock_staleness_max(r.clock_staleness.rbegin()->first);
  }
}

}  // namespace

Result<RunReport> SummarizeRun(const RunPlan& plan, const std::string& run_dir, double target, const Status& status) {
  RunReport r;
  spec::RunSummary& s = r.summary;
  DescribeRun(plan, run_dir, status, s);
  // Worker files, merged into metrics.csv.
  ASSIGN_OR_RETURN(MergedMetrics merged, MergeWorkerMetrics(plan, run_dir));
  const bool any = merged.any;
  const double bytes = merged.bytes, steps_all = merged.steps, comm_ms = merged.comm_ms, hidden_ms = merged.hidden_ms;
  s.set_steps(merged.steps0);
  if (merged.skipped0 >= 0) s.set_skipped_steps(merged.skipped0);
  r.evals = std::move(merged.evals);
  if (!any && status.ok()) return DataLossError(run_dir + ": the run wrote no metrics");
  if (steps_all > 0) {
    s.set_bytes_per_step(bytes / steps_all);
    if (merged.shm_bytes > 0) s.set_shm_bytes_per_step(merged.shm_bytes / steps_all);
  }
  if (!merged.step_ms.empty()) s.set_step_ms(Median(std::move(merged.step_ms)));
  if (hidden_ms > 0 && comm_ms > 0) s.set_overlap_fraction(hidden_ms / comm_ms);
  if (!r.evals.empty()) {
    const EvalPoint& last = r.evals.back();
    s.set_final_test_accuracy(last.accuracy);
    s.set_wall_s(last.wall_s);
    if (last.wall_s > 0) {
      s.set_samples_per_s(static_cast<double>(last.step) * static_cast<double>(plan.batch) * plan.workers / last.wall_s);
    }
    for (const auto& e : r.evals) {
      if (e.accuracy >= target) {
        s.set_time_to_target_s(e.wall_s);
        s.set_steps_to_target(e.step);
        break;
      }
    }
  }
  if (!s.has_samples_per_s() && s.has_step_ms() && s.step_ms() > 0) {
    s.set_samples_per_s(static_cast<double>(plan.batch) * plan.workers * 1e3 / s.step_ms());
  }
  RETURN_IF_ERROR(ReadProcessSummaries(plan, run_dir, r));
  for (const ReportPart* part : ReportParts()) RETURN_IF_ERROR(part->Summarize(plan, run_dir, merged.totals, s));
  SetDerivedNumbers(plan, r);
  return r;
}

std::string SummaryTable(const std::vector<RunReport>& runs, double target) {
  const std::string pct = Fixed(100 * target, 0) + "%";
  std::ostringstream t;
  t << "| run | mode | s | compression | precision | workers | servers | link | straggler | final acc | wall s | time to " << pct
    << " (s) | steps to " << pct << " | samples/s | step ms | bytes/step | formula | comm hidden | "
    << "clock staleness p50/p99/max (clocks) | version lag p50/p99/max (updates) |\n";
  t << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : runs) {
    const auto& s = r.summary;
    auto opt = [](bool has, const std::string& v) { return has ? v : std::string("—"); };
    t << "| " << s.name() << " | " << s.mode()
      << (s.sync_every() > 0 ? ", " + s.outer() + " H=" + std::to_string(s.sync_every()) : "") << " | "
      << (s.has_staleness_bound() ? std::to_string(s.staleness_bound()) : s.mode() == ModeName(config::ASP) ? "∞" : "—") << " | "
      << s.compression() << " | "
      << (s.precision().empty() ? "fp32" : s.precision())
      << (s.has_skipped_steps() ? " (" + std::to_string(s.skipped_steps()) + " skipped)" : "") << " | " << s.workers() << " | " << s.servers() << " | "
      << (s.link().empty() ? "loopback" : s.link()) << " | " << (s.straggler().empty() ? "—" : s.straggler()) << " | ";
    if (!s.ok()) {
      t << "FAILED: " << s.error() << " | | | | | | | | | | |\n";
      continue;
    }
    t << opt(s.has_final_test_accuracy(), Fixed(100 * s.final_test_accuracy(), 2) + "%") << " | "
      << opt(s.has_wall_s(), Fixed(s.wall_s(), 1)) << " | "
      << (s.has_time_to_target_s() ? Fixed(s.time_to_target_s(), 1) : "not reached") << " | "
      << (s.has_steps_to_target() ? std::to_string(s.steps_to_target()) : "—") << " | "
      << opt(s.has_samples_per_s(), Thousands(s.samples_per_s())) << " | "
      << opt(s.has_step_ms(), Fixed(s.step_ms(), s.step_ms() < 10 ? 2 : 1)) << " | "
      << opt(s.has_bytes_per_step(), Thousands(s.bytes_per_step()) +
                                         (s.has_shm_bytes_per_step() ? " (" + Thousands(s.shm_bytes_per_step()) + " shm)" : ""))
      << " | "
      << opt(s.has_formula_bytes_per_step(), Thousands(s.formula_bytes_per_step())) << " | "
      << opt(s.has_overlap_fraction(), Fixed(100 * s.overlap_fraction(), 0) + "%") << " | "
      << (s.has_clock_staleness_p50() ? std::to_string(s.clock_staleness_p50()) + " / " +
                                            std::to_string(s.clock_staleness_p99()) + " / " +
                                            std::to_string(s.clock_staleness_max())
                                      : "—")
      << " | "
      << (s.has_version_lag_p50() ? std::to_string(s.version_lag_p50()) + " / " + std::to_string(s.version_lag_p99()) +
                                        " / " + std::to_string(s.version_lag_max())
                                  : "—")
      << " |\n";
  }
  return t.str();
}

PlotStyle RunPlotStyle(const spec::RunSummary& s, size_t index, size_t count) {
  PlotStyle st;
  const std::string& mode = s.mode();
  st.color = mode == ModeName(config::BSP)         ? "#1f77b4"
             : mode == ModeName(config::SSP)       ? "#2ca02c"
             : mode == ModeName(config::ASP)       ? "#d62728"
             : mode == ModeName(config::ALLREDUCE) ? "#9467bd"
                                                   : "#7f7f7f";
  st.dashed = !s.compression().empty() && s.compression() != "none";
  // Earlier curves wider, so that a later curve drawn over an identical one leaves it showing
  // as a border; and a point type per run.
  st.width = count > 1 ? 1.5 + 1.5 * static_cast<double>(count - 1 - index) / static_cast<double>(count - 1) : 2.0;
  st.point = 1 + static_cast<int>(index % 13);
  return st;
}

namespace {
// A histogram as its cumulative distribution: "value fraction_at_or_below" per value taken.
void WriteCdf(const std::string& path, const std::map<int64_t, int64_t>& h, const char* what) {
  std::ofstream f(path);
  int64_t total = 0;
  for (const auto& [k, v] : h) total += v;
  f << "# " << what << " cumulative_fraction\n";
  if (h.empty() || total <= 0) return;
  f << h.begin()->first - 1 << " 0\n";  // the step up to the first value
  int64_t seen = 0;
  for (const auto& [k, v] : h) {
    seen += v;
    f << k << " " << static_cast<double>(seen) / static_cast<double>(total) << "\n";
  }
}
}  // namespace

// Curves closer than this (percentage points of accuracy, at every evaluation) draw as one.
constexpr double kSameCurvePoints = 0.25;

namespace {

// Dashes long enough to read as dashes at 960 px whatever the width (gnuplot's "dt 2" at a
// thin width reads as a solid line).
std::string LineStyle(const PlotStyle& st, bool points) {
  std::ostringstream o;
  o << " lc rgb '" << st.color << "' lw " << Fixed(st.width, 2) << " dt " << (st.dashed ? "(16,8)" : "1");
  if (points) o << " pt " << st.point << " ps 1";
  return o.str();
}

// The axes of the accuracy plots: accuracy from y_lo to y_hi, wall time from lo_s to hi_s.
struct AccuracyAxes {
  double y_lo = 0, y_hi = 0, lo_s = 0, hi_s = 0;
  bool log_time = false;  // a logarithmic time axis, with these 1-2-5 tics
  std::string time_tics;
};

AccuracyAxes AxesFor(const std::vector<RunReport>& runs) {
  AccuracyAxes a;
  // The accuracy axis: a margin below the lowest evaluation, so that no point sits on the frame.
  double lo_acc = 100, hi_acc = 0, lo_s = 0, hi_s = 0;
  for (const auto& r : runs) {
    for (const auto& p : r.evals) {
      lo_acc = std::min(lo_acc, 100 * p.accuracy);
      hi_acc = std::max(hi_acc, 100 * p.accuracy);
      lo_s = lo_s > 0 ? std::min(lo_s, p.wall_s) : p.wall_s;
      hi_s = std::max(hi_s, p.wall_s);
    }
  }
  a.lo_s = lo_s, a.hi_s = hi_s;
  a.y_lo = std::max(0.0, 5 * std::floor((lo_acc - 0.05 * std::max(5.0, hi_acc - lo_acc)) / 5));
  a.y_hi = std::min(100.0, std::ceil(hi_acc + 0.03 * std::max(5.0, hi_acc - lo_acc)));
  // Fast runs would be crammed into the left edge of a linear time axis when the slowest takes
  // many times as long: then the axis is logarithmic, with 1-2-5 tics.
  a.log_time = lo_s > 0 && hi_s > 6 * lo_s;
  if (a.log_time) {
    for (double decade = std::pow(10, std::floor(std::log10(lo_s))); decade <= hi_s; decade *= 10) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double t = m * decade;
        if (t < lo_s / 1.5 || t > hi_s * 1.5) continue;
        a.time_tics += (a.time_tics.empty() ? "" : ", ") + Trimmed(t);
      }
    }
  }
  return a;
}

// The plot commands' curves, run by run, and what the script around them needs to know.
struct PlotCurves {
  std::ostringstream time_plot, epoch_plot, clock_plot, lag_plot, bounds;
  size_t curve = 0, stale = 0;          // the curves on the accuracy and on the staleness plots
  std::vector<const RunReport*> drawn;  // the runs on the accuracy plots so far
  size_t longest_title = 0;             // in characters: how many legend columns fit
  int64_t lag_p99 = 0;  // the largest p99 version lag over the runs: the lag panel's x range
};

// An earlier run whose accuracy is within kSameCurvePoints of r's at every evaluation, or null.
const RunReport* SameCurve(const std::vector<const RunReport*>& drawn, const RunReport& r) {
  for (const RunReport* earlier : drawn) {
    if (earlier->evals.size() != r.evals.size()) continue;
    bool equal = true;
    for (size_t i = 0; i < r.evals.size() && equal; ++i) {
      equal = std::abs(earlier->evals[i].epoch - r.evals[i].epoch) < 1e-9 &&
              100 * std::abs(earlier->evals[i].accuracy - r.evals[i].accuracy) <= kSameCurvePoints;
    }
    if (equal) return earlier;
  }
  return nullptr;
}

// The run's accuracy curves (vs time, vs epochs), from DIR/plots/<run>.dat, which this writes.
void AddAccuracyCurves(const RunReport& r, size_t evaluated, const std::string& dir, PlotCurves& c) {
  const PlotStyle st = RunPlotStyle(r.summary, c.curve, evaluated);
  const std::string data = dir + "/plots/" + r.summary.name() + ".dat";
  std::ofstream d(data);
  d << "# wall_s epoch step test_accuracy_percent\n";
  for (const auto& p : r.evals) d << p.wall_s << " " << p.epoch << " " << p.step << " " << 100 * p.accuracy << "\n";
  const std::string sep = c.curve ? ", " : "";
  c.time_plot << sep << "'" << data << "' using 1:4 with linespoints" << LineStyle(st, true) << " title '" << r.summary.name() << "'";
  // A run whose accuracy is within a line's width of an earlier run's at every evaluation
  // (all-reduce and bsp compute the same steps, up to the order of a sum) would hide that one's
  // curve: it is drawn as a thin line with large open circles over it, and the legend says so.
  if (const RunReport* same = SameCurve(c.drawn, r); same != nullptr) {
    c.epoch_plot << sep << "'" << data << "' using 2:4 with linespoints lc rgb '" << st.color << "' lw 1 dt " << (st.dashed ? "(16,8)" : "1")
                 << " pt 6 ps 2 title '" << r.summary.name() << " (= " << same->summary.name() << ", within " << Trimmed(kSameCurvePoints) << ")'";
    c.longest_title = std::max(c.longest_title, r.summary.name().size() + same->summary.name().size() + 18);
  } else {
    c.epoch_plot << sep << "'" << data << "' using 2:4 with linespoints" << LineStyle(st, true) << " title '" << r.summary.name() << "'";
  }
  c.longest_title = std::max(c.longest_title, r.summary.name().size());
  c.drawn.push_back(&r);
  ++c.curve;
}

// A PS run's staleness as a CDF (a step at each value it took): empty bins draw a flat step,
// not a line across them, and a run that is always 0 (bsp) is a step to 1 at 0.
void AddStalenessCurves(const RunReport& r, size_t stale_runs, const std::string& dir, PlotCurves& c) {
  const PlotStyle ss = RunPlotStyle(r.summary, c.stale, stale_runs);
  const std::string cd = dir + "/plots/" + r.summary.name() + ".clock_staleness.dat";
  const std::string ld = dir + "/plots/" + r.summary.name() + ".version_lag.dat";
  WriteCdf(cd, r.clock_staleness, "clock_staleness");
  WriteCdf(ld, r.version_lag, "version_lag");
  c.lag_p99 = std::max(c.lag_p99, HistogramQuantile(r.version_lag, 0.99));
  const std::string ssep = c.stale ? ", " : "";
  c.clock_plot << ssep << "'" << cd << "' using 1:2 with steps" << LineStyle(ss, false) << " title '" << r.summary.name() << "'";
  c.lag_plot << ssep << "'" << ld << "' using 1:2 with steps" << LineStyle(ss, false) << " title '" << r.summary.name() << "'";
  if (r.summary.has_staleness_bound()) {
    // The ssp bound: clock staleness never passes it.
    const int s = r.summary.staleness_bound();
    c.bounds << "set arrow from " << s << ", graph 0 to " << s << ", graph 1 nohead dt 3 lw 1.5 lc rgb '" << ss.color
             << "'\nset label 's = " << s << " (" << r.summary.name() << ")' at " << s << ", graph " << Fixed(0.95 - 0.06 * static_cast<double>(c.stale), 2)
             << " offset 0.5,0 tc rgb '" << ss.color << "'\n";
  }
  ++c.stale;
}

// The staleness plot's part of the script: clock staleness above, version lag below.
void StalenessScript(const std::string& title, const std::string& dir, const PlotCurves& c, std::ostringstream& gp) {
  gp << "set terminal pngcairo size 960,900 noenhanced\nset output '" << dir << "/staleness.png'\n"
     << "set multiplot layout 2,1 title '" << title << ": staleness (PS runs), cumulative'\n"
     << "set key bottom right\nset yrange [0:1.05]\nset xrange [-0.5:*]\n"
     << "set title 'clock staleness of answered pulls (dotted: the ssp bound s)'\n"
     << "set xlabel 'clock staleness (clocks)'\nset ylabel 'fraction of pulls at or below'\n"
     << c.bounds.str() << "plot " << c.clock_plot.str() << "\n"
     << "unset arrow\nunset label\n"
     // A rare large lag (an asp straggler's) would squeeze every curve into the left edge: the
     // axis ends at twice the largest p99, and the maxima are in the table.
     << "set xrange [-0.5:" << std::max<int64_t>(5, 2 * c.lag_p99) << "]\n"
     << "set title 'version lag of applied gradients (axis to twice the largest p99; maxima in the table)'\n"
     << "set xlabel 'version lag (shard updates)'\nset ylabel 'fraction of gradients at or below'\nplot " << c.lag_plot.str() << "\n"
     << "unset multiplot\n";
}

}  // namespace

std::string PlotScript(const Experiment& e, const std::vector<RunReport>& runs, const std::string& dir) {
  size_t evaluated = 0, stale_runs = 0;
  for (const auto& r : runs) evaluated += r.evals.empty() ? 0 : 1;
  for (const auto& r : runs) stale_runs += !r.version_lag.empty() && !r.clock_staleness.empty() ? 1 : 0;
  if (evaluated == 0) return "";
  const AccuracyAxes axes = AxesFor(runs);
  PlotCurves c;
  for (const auto& r : runs) {
    if (r.evals.empty()) continue;
    AddAccuracyCurves(r, evaluated, dir, c);
    if (r.version_lag.empty() || r.clock_staleness.empty()) continue;
    AddStalenessCurves(r, stale_runs, dir, c);
  }
  const bool simulated = std::any_of(runs.begin(), runs.end(), [](const RunReport& r) { return r.summary.simulated(); });
  const std::string title = e.name + (simulated ? " (simulated)" : "");
  std::ostringstream gp;
  // The legend goes under the plot, in columns: inside, it would cover the end of the curves
  // (and a run with a single evaluation is a single point, easily hidden).
  // About 8 px a character at this font, and a column holds its sample line (8 characters).
  const size_t key_cols = std::clamp<size_t>(860 / ((c.longest_title + 8) * 8), 1, 3);
  const size_t key_rows = (c.curve + key_cols - 1) / key_cols;
  gp << "# Each mode one colour (bsp blue, ssp green, asp red, allreduce purple, local grey); dense\n"
     << "# runs solid, compressed dashed; earlier curves wider, and a curve equal to an earlier one\n"
     << "# thin with open circles, so coinciding curves stay visible.\n"
     << "set terminal pngcairo size 960," << 560 + 20 * key_rows << " noenhanced\nset grid\n"
     << "set key below maxcols " << key_cols << " width 2\nset bmargin " << 4 + key_rows << "\n"
     << "set ylabel 'test accuracy (%)'\nset yrange [" << Trimmed(axes.y_lo) << ":" << Trimmed(axes.y_hi) << "]\n"
     << "set output '" << dir << "/accuracy_vs_time.png'\nset title '" << title << ": test accuracy vs wall time'\n";
  if (axes.log_time) {
    gp << "set logscale x\nset xrange [" << Trimmed(axes.lo_s / 1.25) << ":" << Trimmed(axes.hi_s * 1.25) << "]\nset xtics ("
       << axes.time_tics << ")\n"
       << "set xlabel 'wall time (s, logarithmic)'\n";
  } else {
    gp << "set xlabel 'wall time (s)'\n";
  }
  gp << "plot " << c.time_plot.str() << "\n";
  if (axes.log_time) gp << "unset logscale x\nset xrange [*:*]\nset xtics autofreq\n";
  gp << "set output '" << dir << "/accuracy_vs_epoch.png'\nset title '" << title << ": test accuracy vs epochs'\n"
     << "set xlabel 'epochs'\nplot " << c.epoch_plot.str() << "\nset yrange [*:*]\nunset bmargin\n";
  if (c.stale > 0) StalenessScript(title, dir, c, gp);
  for (const ReportPart* part : ReportParts()) gp << part->PlotScript(title, runs, dir);
  return gp.str();
}

namespace {

// summary.md: the table, what each column means, and the plots.
void WriteSummaryMarkdown(const Experiment& e, const std::vector<RunReport>& runs, const std::string& dir) {
  std::ofstream md(dir + "/summary.md");
  const bool simulated = std::any_of(runs.begin(), runs.end(), [](const RunReport& r) { return r.summary.simulated(); });
  md << "# " << e.name << (simulated ? " (simulated)" : "") << "\n\n";
  if (!e.description.empty()) md << e.description << "\n\n";
  if (simulated) {
    md << "**Simulated by gradsync-sim, not run.** Spec: `" << e.path << "`. The simulation wrote the files a real run "
       << "writes (`<run>/metrics.csv`, `<run>/server-*.json`, `<run>/worker-0.json`) and every number below is "
       << "computed from them as for a real run. Steps, time and bytes are simulated; accuracy is not: a run's "
       << "accuracy at step k is the measured accuracy-vs-step curve it names (same mode and staleness, measured at "
       << "small scale) at step k, placed at the simulated time of step k. A run that names none has no accuracy.\n\n";
    for (const auto& r : runs) md << "- " << r.summary.name() << ": " << r.summary.simulation() << "\n";
    md << "\n";
  } else {
    md << "Spec: `" << e.path << "`. Every number below is computed from the files the runs' processes wrote "
       << "(`<run>/metrics.csv`, `<run>/server-*.json`, `<run>/worker-0.json`); the command lines are in "
       << "`<run>/commands.txt`.\n\n";
  }
  md << SummaryTable(runs, e.target_accuracy) << "\n";
  md << "- final acc: worker 0's last evaluation on the whole test set; wall s: its time at that evaluation.\n"
     << "- bytes/step: bytes sent + received per worker and step, on every path: over the wire (ZeroMQ, data "
     << "channels, the ring's TCP; headers, heartbeats and worker 0's evaluation pulls included) and, in "
     << "parentheses, the part moved through shared memory between processes of one host (PS lanes, the "
     << "all-reduce's shared-memory group), counted as the wire would count it; formula: what a dense run must move per worker "
     << "and step (PS: a push and a pull of the model, 8P bytes; ring: 2(n-1)/n of it each way, 16P(n-1)/n).\n"
     << "- precision: --precision; fp16 runs say how many steps worker 0 skipped because the loss-scaled "
     << "gradient overflowed (dynamic loss scaling halves the scale at each).\n"
     << "- samples/s: steps x batch x workers / wall s (without evaluations: batch x workers / step ms).\n"
     << "- step ms: per worker, wall time from its training row at 10% of its steps to its last, over the steps "
     << "between; the median over the workers.\n"
     << "- comm hidden: with --overlap, the share of communication time that ran behind computation "
     << "(all-reduce: the buckets' all-reduce during backward; PS: pulls and pushes in flight while layers "
     << "computed, measured at layer boundaries, a lower bound).\n"
     << "- clock staleness (PS modes, over every answered pull on every shard): the pulling worker's clock minus "
     << "the lowest clock whose updates the answer is guaranteed to hold; bsp 0, ssp at most s, asp unbounded.\n"
     << "- version lag (PS modes, over every applied gradient on every shard): shard updates between the version "
     << "a gradient was computed on and the one it was applied to; n equal-speed asp workers see about n-1.\n\n"
     << "![accuracy vs time](accuracy_vs_time.png)\n![accuracy vs epoch](accuracy_vs_epoch.png)\n";
  bool any_staleness = false;
  for (const auto& r : runs) any_staleness = any_staleness || !r.version_lag.empty() || !r.clock_staleness.empty();
  if (any_staleness) md << "![staleness](staleness.png)\n";
  for (const ReportPart* part : ReportParts()) md << part->Section(runs);
  for (const auto& r : runs) {
    if (!r.timeline.empty()) {
      md << "\n### Timeline of " << r.summary.name() << "\n\n![timeline of " << r.summary.name() << "](" << r.timeline
         << ")\n\nThe whole run: `" << r.summary.name() << "/trace.json` (Perfetto, chrome://tracing).\n";
    }
  }
}

// The PNG plots (gnuplot) and their data under dir/plots/.
Status WritePlots(const Experiment& e, const std::vector<RunReport>& runs, const std::string& dir) {
  const std::string text = PlotScript(e, runs, dir);
  if (text.empty()) return OkStatus();  // nothing evaluated: no plots
  const std::string script = dir + "/plots/plots.gp";
  std::ofstream(script) << text;
  return RunCommand({"gnuplot", script}, 60).WithContext("plots need gnuplot (scripts/setup.sh installs gnuplot-nox)");
}

}  // namespace

Result<spec::Summary> ReadSummary(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFoundError(path + ": cannot read");
  std::stringstream text;
  text << f.rdbuf();
  spec::Summary s;
  if (auto st = google::protobuf::util::JsonStringToMessage(text.str(), &s); !st.ok()) {
    return DataLossError(path + ": not a summary.json: " + st.ToString());
  }
  return s;
}

Status WriteReport(const Experiment& e, const std::vector<RunReport>& runs, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir + "/plots", ec);
  if (ec) return UnavailableError(dir + ": cannot create: " + ec.message());
  // summary.json
  spec::Summary summary;
  summary.set_experiment(e.name);
  summary.set_description(e.description);
  summary.set_target_accuracy(e.target_accuracy);
  for (const auto& r : runs) *summary.add_run() = r.summary;
  std::string json;
  google::protobuf::util::JsonPrintOptions jo;
  jo.add_whitespace = true;
  jo.preserve_proto_field_names = true;
  if (auto st = google::protobuf::util::MessageToJsonString(summary, &json, jo); !st.ok()) {
    return InternalError("summary.json: " + st.ToString());
  }
  std::ofstream(dir + "/summary.json") << json;
  WriteSummaryMarkdown(e, runs, dir);
  return WritePlots(e, runs, dir);
}

std::string PicturesText(const std::vector<RunReport>& runs, const std::string& dir) {
  std::error_code ec;
  std::string plots;
  std::vector<std::string> pngs = {"accuracy_vs_time.png", "accuracy_vs_epoch.png", "staleness.png"};
  for (const ReportPart* part : ReportParts()) {
    for (const std::string& png : part->Pictures()) pngs.push_back(png);
  }
  for (const std::string& png : pngs) {
    if (std::filesystem::exists(dir + "/" + png, ec)) plots += (plots.empty() ? dir + "/" : ", ") + png;
  }
  std::string text = plots.empty() ? "" : "plots: " + plots + "\n";
  for (const auto& r : runs) {
    if (!r.timeline.empty()) text += "timeline of " + r.summary.name() + ": " + dir + "/" + r.timeline + "\n";
  }
  return text;
}

}  // namespace gradsync
