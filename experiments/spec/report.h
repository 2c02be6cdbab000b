// Reports: what a finished run's files say, and the experiment's summary.md, summary.json and
// plots. Every number comes from the files the processes wrote (worker-<r>.csv metrics rows,
// worker-<r>.json and server-<k>.json summaries): nothing is typed in by hand.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "experiment.pb.h"
#include "experiments/spec/spec.h"

namespace gradsync {

struct EvalPoint {
  int64_t step = 0;
  double epoch = 0;
  double wall_s = 0;
  double accuracy = 0;  // fraction
  double auc = NAN;     // a model that scores by a probability (dlrm): test AUC; NaN otherwise
};

struct RunReport {
  spec::RunSummary summary;
  std::vector<EvalPoint> evals;               // worker 0's evaluation rows
  std::map<int64_t, int64_t> version_lag;      // over all shards (PS modes): gradients by lag
  std::map<int64_t, int64_t> clock_staleness;  // over all shards (PS modes): pulls by staleness
  std::string timeline;                        // the run's timeline picture (file name in the experiment's folder), or ""
};

// What every worker's training rows add up to, for the parts below: the rows, and the sum of their
// table_rows column.
struct TrainingRowTotals {
  double rows = 0;
  double table_rows = 0;
};

// A part of the report that only some runs have (tables_report.h's, for models with embedding
// tables): numbers of its own read from a run's files into its RunSummary fields, a section of
// summary.md, plots and their pictures. The report calls every part of ReportParts() at the same
// four places, and knows none of them.
class ReportPart {
 public:
  virtual ~ReportPart() = default;
  // Sets the part's fields of s from the run's plan, its training rows' totals and the process
  // summaries in run_dir; leaves them unset for a run the part is not about.
  virtual Status Summarize(const RunPlan& plan, const std::string& run_dir, const TrainingRowTotals& totals,
                           spec::RunSummary& s) const = 0;
  // Its section of summary.md ("" when no run has the part).
  virtual std::string Section(const std::vector<RunReport>& runs) const = 0;
  // The gnuplot commands of its plots (their data under dir/plots/; "" when it draws none).
  virtual std::string PlotScript(const std::string& title, const std::vector<RunReport>& runs,
                                 const std::string& dir) const = 0;
  // The file names of the pictures it may draw, in the experiment's folder.
  virtual std::vector<std::string> Pictures() const = 0;
};

// Every part of the report, in the order of their sections (report_parts.cc).
const std::vector<const ReportPart*>& ReportParts();

// Reads run_dir's worker-*.csv, worker-0.json and server-*.json, writes run_dir/metrics.csv (every worker's
// rows, in worker order) and returns the run's numbers. `status` is how the run ended.
Result<RunReport> SummarizeRun(const RunPlan& plan, const std::string& run_dir, double target_accuracy,
                               const Status& status);

// A worker's time per step (ms) from its training rows (step, wall_s), as summary's step_ms counts
// it per worker: from the row at 10% of its last step (its first row at or past it) to its last
// row; NaN with fewer than two such rows.
double StepMs(const std::vector<std::pair<int64_t, double>>& rows);

// The summary table (markdown) of these runs.
std::string SummaryTable(const std::vector<RunReport>& runs, double target_accuracy);

// How a run is drawn: its mode's colour, dashed when compressed, earlier runs wider (so that a
// curve drawn over an identical one leaves it visible), a point type per run.
struct PlotStyle {
  std::string color;
  bool dashed = false;
  double width = 2.0;
  int point = 1;
};
PlotStyle RunPlotStyle(const spec::RunSummary& run, size_t index, size_t count);

// The gnuplot script of the plots (accuracy vs time and epochs; staleness as a CDF per run with
// each ssp run's bound marked), writing the data under dir/plots/; "" when no run evaluated.
std::string PlotScript(const Experiment& e, const std::vector<RunReport>& runs, const std::string& dir);

// `v` with `digits` digits after the point ("12.50").
std::string Fixed(double v, int digits);
// A number as gnuplot reads it, without trailing zeros (0.5, 2, 55).
std::string Trimmed(double v);
// `v` rounded, with thousands separated by commas ("1,234,567").
std::string Thousands(double v);

// Reads an experiment's summary.json (WriteReport's); an unreadable or unparsable file is an error
// naming it.
Result<spec::Summary> ReadSummary(const std::string& path);

// Writes dir/summary.md, dir/summary.json and the PNG plots (dir/accuracy_vs_time.png,
// dir/accuracy_vs_epoch.png, dir/staleness.png when a run has staleness) with gnuplot.
Status WriteReport(const Experiment& e, const std::vector<RunReport>& runs, const std::string& dir);

// Where WriteReport's pictures are, for the terminal: "plots: DIR/accuracy_vs_time.png, ..." and
// one "timeline of RUN: DIR/timeline-RUN.png" line per traced run ("" when there are none).
std::string PicturesText(const std::vector<RunReport>& runs, const std::string& dir);

}  // namespace gradsync
