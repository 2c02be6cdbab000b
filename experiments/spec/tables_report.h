// The report's part for models with embedding tables (dlrm, sparse_logreg): the numbers only such
// runs have (test AUC, rows per step on every path, the row cache's share, peak memory, the rows
// the shards hold), their table in summary.md, the AUC plots, and the crossover: at which table
// size the parameter server overtakes all-reduce, for each model, link, batch and worker count
// the experiment ran.
// Every number comes from the processes' files, as in report.h; gradsync-sim's runs go through
// the same code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "experiment.pb.h"
#include "experiments/spec/report.h"
#include "experiments/spec/spec.h"

namespace gradsync {

// Sets s's table fields from the run's plan, its metrics' rows and every process summary in
// run_dir (worker-<r>.json, server-<k>.json; a missing one is skipped, an unreadable one an
// error). Leaves them unset for a run without tables.
Status AddTableNumbers(const RunPlan& plan, const std::string& run_dir, const TrainingRowTotals& totals,
                       spec::RunSummary& s);

// One (model, link, workers, batch) group's comparison: at each table size, the fastest PS run
// and the all-reduce run.
struct CrossoverPoint {
  int64_t table_ids = 0;
  std::string ps_run;     // the fastest PS run at this size ("" when none ran)
  double ps_samples_per_s = 0;
  std::string allreduce_run;  // "" when none ran
  double allreduce_samples_per_s = 0;
  double touched_over_held = 0;  // the PS run's rows per worker-step over the rows its shards hold
};
struct Crossover {
  std::string model;
  std::string link;  // "loopback" or the rate
  int workers = 0;
  int64_t batch = 0;
  std::vector<CrossoverPoint> points;  // by table size, each with both a PS and an all-reduce run
  // The smallest measured size from which the PS is ahead at every larger size, with all-reduce
  // ahead at some smaller one; 0 when there is none (see `verdict`).
  int64_t crossover_ids = 0;
  std::string verdict;  // one sentence
};

// The crossovers of these runs (successful ones with tables), in the order their groups first appear.
std::vector<Crossover> FindCrossovers(const std::vector<RunReport>& runs);

// summary.md's section for runs with tables: their table, what its columns mean, the crossover per
// group and the AUC plots; "" when no run has tables.
std::string TablesSection(const std::vector<RunReport>& runs);

// The gnuplot commands of auc_vs_samples.png and auc_vs_time.png (every run with an AUC, data
// under dir/plots/); "" when no run evaluated an AUC.
std::string AucPlotScript(const std::string& title, const std::vector<RunReport>& runs, const std::string& dir);

// The report's part for tables (ReportParts() holds one): the functions above.
class TablesReport final : public ReportPart {
 public:
  Status Summarize(const RunPlan& plan, const std::string& run_dir, const TrainingRowTotals& totals,
                   spec::RunSummary& s) const override {
    return AddTableNumbers(plan, run_dir, totals, s);
  }
  std::string Section(const std::vector<RunReport>& runs) const override { return TablesSection(runs); }
  std::string PlotScript(const std::string& title, const std::vector<RunReport>& runs,
                         const std::string& dir) const override {
    return AucPlotScript(title, runs, dir);
  }
  std::vector<std::string> Pictures() const override { return {"auc_vs_samples.png", "auc_vs_time.png"}; }
};

}  // namespace gradsync
