#include "experiments/spec/tables_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "common/config/sync_decisions.h"
#include "common/config/train_config.h"
#include "common/obs/process_summary.h"

namespace gradsync {

namespace {

bool HasTables(const spec::RunSummary& s) { return s.has_table_rows_per_step(); }

// "10^6" for a power of ten, "2^20" for one of two, else the number with separators; "any" for 0
// (any 64-bit id).
std::string IdsText(int64_t ids) {
  if (ids == 0) return "any";
  int64_t p = 1;
  for (int k = 0; k <= 18 && p <= ids; ++k) {
    if (p == ids) return k == 0 ? "1" : "10^" + std::to_string(k);
    if (k < 18) p *= 10;
  }
  if ((ids & (ids - 1)) == 0) return "2^" + std::to_string(__builtin_ctzll(static_cast<unsigned long long>(ids)));
  return Thousands(static_cast<double>(ids));
}

// The ids a table of the run's model can hold: dlrm's click_ids per feature, sparse_logreg's
// 2^feature_bits hashed features (its one table, as models/sparse_logreg.cc makes it).
int64_t IdsPerTable(const config::TrainConfig& t) {
  return t.model() == "sparse_logreg" ? int64_t{1} << t.feature_bits() : t.click_ids();
}

std::string Percent(double fraction) { return Fixed(100 * fraction, fraction < 0.1 ? 1 : 0) + "%"; }

}  // namespace

Status AddTableNumbers(const RunPlan& plan, const std::string& run_dir, const TrainingRowTotals& totals,
                       spec::RunSummary& s) {
  const config::TrainConfig& train = plan.run.train();
  double pulled = 0, cached = 0, steps = 0, worker_rss = 0;
  int64_t max_read = -1;
  bool any_table = totals.table_rows > 0;
  for (int w = 0; w < plan.workers; ++w) {
    auto ws = ReadProcessSummary(ProcessSummaryPath(run_dir, "worker", w));
    if (!ws.ok()) {
      if (ws.status().code() == StatusCode::kNotFound) continue;
      return ws.status();
    }
    if (w == 0 && ws->has_final_test_auc()) s.set_final_test_auc(ws->final_test_auc());
    pulled += static_cast<double>(ws->rows_pulled());
    cached += static_cast<double>(ws->cache_hits());
    steps += static_cast<double>(ws->steps());
    if (ws->has_max_read_staleness()) max_read = std::max<int64_t>(max_read, ws->max_read_staleness());
    worker_rss = std::max(worker_rss, ws->peak_rss_mib());
  }
  double server_rss = 0, server_mib = 0;
  int64_t server_rows = 0;
  for (int k = 0; k < plan.servers; ++k) {
    auto ss = ReadProcessSummary(ProcessSummaryPath(run_dir, "server", k));
    if (!ss.ok()) {
      if (ss.status().code() == StatusCode::kNotFound) continue;
      return ss.status();
    }
    server_rss = std::max(server_rss, ss->peak_rss_mib());
    server_rows += ss->table_rows();
    server_mib += ss->table_mib();
  }
  any_table = any_table || server_rows > 0 || pulled > 0;
  if (!any_table) return OkStatus();
  s.set_table_ids(IdsPerTable(train));
  if (totals.rows > 0) s.set_table_rows_per_step(totals.table_rows / totals.rows);
  if (plan.mode != config::ALLREDUCE && steps > 0) s.set_rows_pulled_per_step(pulled / steps);
  if (plan.mode == config::SSP) {
    const bool on = RowCacheBound(train.row_cache(), ModeName(plan.mode), plan.staleness) > 0;
    s.set_row_cache(on);
    if (on && pulled + cached > 0) s.set_cache_hit_rate(cached / (pulled + cached));
  }
  if (max_read >= 0) s.set_max_read_staleness(max_read);
  if (worker_rss > 0) s.set_worker_peak_rss_mib(worker_rss);
  if (server_rss > 0) s.set_server_peak_rss_mib(server_rss);
  if (plan.servers > 0) {
    s.set_server_table_rows(server_rows);
    s.set_server_table_mib(server_mib);
  }
  return OkStatus();
}

std::vector<Crossover> FindCrossovers(const std::vector<RunReport>& runs) {
  using Key = std::tuple<std::string, std::string, int, int64_t>;
  std::vector<Key> order;
  std::map<Key, std::map<int64_t, CrossoverPoint>> groups;
  for (const auto& r : runs) {
    const spec::RunSummary& s = r.summary;
    if (!s.ok() || !HasTables(s) || !s.has_samples_per_s()) continue;
    const Key key{s.model(), s.link().empty() ? "loopback" : s.link(), s.workers(), s.batch()};
    if (!groups.count(key)) order.push_back(key);
    CrossoverPoint& p = groups[key][s.table_ids()];
    p.table_ids = s.table_ids();
    if (s.mode() == ModeName(config::ALLREDUCE)) {
      if (s.samples_per_s() > p.allreduce_samples_per_s) {
        p.allreduce_run = s.name();
        p.allreduce_samples_per_s = s.samples_per_s();
      }
    } else if (s.samples_per_s() > p.ps_samples_per_s) {
      p.ps_run = s.name();
      p.ps_samples_per_s = s.samples_per_s();
      p.touched_over_held = s.server_table_rows() > 0 ? s.table_rows_per_step() / static_cast<double>(s.server_table_rows()) : 0;
    }
  }
  std::vector<Crossover> out;
  for (const Key& key : order) {
    Crossover c;
    std::tie(c.model, c.link, c.workers, c.batch) = key;
    for (const auto& [ids, p] : groups[key]) {
      if (!p.ps_run.empty() && !p.allreduce_run.empty()) c.points.push_back(p);
    }
    if (c.points.empty()) continue;
    // "Any id" (0) is the largest table of all: it sorts last.
    std::stable_sort(c.points.begin(), c.points.end(), [](const CrossoverPoint& a, const CrossoverPoint& b) {
      return (a.table_ids == 0 ? INT64_MAX : a.table_ids) < (b.table_ids == 0 ? INT64_MAX : b.table_ids);
    });
    const auto ahead = [](const CrossoverPoint& p) { return p.ps_samples_per_s > p.allreduce_samples_per_s; };
    size_t from = c.points.size();  // the PS is ahead at every point from here on
    while (from > 0 && ahead(c.points[from - 1])) --from;
    const std::string range = IdsText(c.points.front().table_ids) + " to " + IdsText(c.points.back().table_ids) + " ids";
    const std::string where = (c.model.empty() ? "" : c.model + ", ") + c.link + ", " + std::to_string(c.workers) +
                              " workers, batch " + std::to_string(c.batch);
    if (from == 0) {
      c.verdict = where + ": the PS is ahead at every table size measured (" + range + ")";
    } else if (from == c.points.size()) {
      c.verdict = where + ": all-reduce is ahead at every table size measured (" + range + ")";
    } else {
      const CrossoverPoint& at = c.points[from];
      c.crossover_ids = at.table_ids;
      const bool mixed = std::any_of(c.points.begin(), c.points.begin() + static_cast<long>(from), ahead);
      c.verdict = where + ": the PS overtakes all-reduce at " + IdsText(at.table_ids) + " ids per table (" + at.ps_run +
                  " " + Fixed(at.ps_samples_per_s / at.allreduce_samples_per_s, 2) + "x " + at.allreduce_run +
                  "; all-reduce ahead at " + IdsText(c.points[from - 1].table_ids) +
                  (mixed ? ", and the lead changed hands below" : "") + "); there a worker's step touches " +
                  Percent(at.touched_over_held) + " of the rows the shards hold";
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::string TablesSection(const std::vector<RunReport>& runs) {
  if (std::none_of(runs.begin(), runs.end(), [](const RunReport& r) { return HasTables(r.summary); })) return "";
  std::ostringstream md;
  md << "\n## Embedding tables\n\n"
     << "| run | mode | s | cache | servers | link | ids per table | batch | final AUC | samples/s | rows/step | "
        "pulled/step | cache served | max read staleness | bytes/step | worker peak MiB | shard peak MiB | shards' rows (MiB) |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const auto opt = [](bool has, const std::string& v) { return has ? v : std::string("—"); };
  for (const auto& r : runs) {
    const spec::RunSummary& s = r.summary;
    if (!HasTables(s)) continue;
    md << "| " << s.name() << " | " << s.mode() << " | "
       << (s.has_staleness_bound() ? std::to_string(s.staleness_bound()) : s.mode() == ModeName(config::ASP) ? "∞" : "—")
       << " | " << (s.has_row_cache() ? (s.row_cache() ? "on" : "off") : "—") << " | " << s.servers() << " | "
       << (s.link().empty() ? "loopback" : s.link()) << " | " << IdsText(s.table_ids()) << " | " << s.batch() << " | "
       << opt(s.has_final_test_auc(), Fixed(s.final_test_auc(), 4)) << " | "
       << opt(s.has_samples_per_s(), Thousands(s.samples_per_s())) << " | " << Thousands(s.table_rows_per_step()) << " | "
       << opt(s.has_rows_pulled_per_step(), Thousands(s.rows_pulled_per_step())) << " | "
       << opt(s.has_cache_hit_rate(), Percent(s.cache_hit_rate())) << " | "
       << opt(s.has_max_read_staleness(), std::to_string(s.max_read_staleness())) << " | "
       << opt(s.has_bytes_per_step(), Thousands(s.bytes_per_step())) << " | "
       << opt(s.has_worker_peak_rss_mib(), Thousands(s.worker_peak_rss_mib())) << " | "
       << opt(s.has_server_peak_rss_mib(), Thousands(s.server_peak_rss_mib())) << " | "
       << opt(s.has_server_table_rows(), Thousands(static_cast<double>(s.server_table_rows())) + " (" +
                                             Fixed(s.server_table_mib(), 1) + ")")
       << " |\n";
  }
  md << "\n- rows/step: per worker and step, the batch's unique ids over every table (the rows it reads and whose "
        "gradients it sends); pulled/step: of its reads, the rows pulled from the shards (PS); cache served: the share "
        "of reads ssp's row cache answered; max read staleness: the oldest row a worker read (clocks, the workers' "
        "own count; ssp keeps it <= s).\n"
     << "- bytes/step: as above, every path (PS: the rows' and the dense parameters' push and pull; all-reduce: the "
        "rows' all-gather and the dense all-reduce).\n"
     << "- peak MiB: the largest peak resident set among the workers and among the shards; shards' rows: the rows "
        "every shard holds at the end, summed, and their MiB.\n";
  const std::vector<Crossover> crossovers = FindCrossovers(runs);
  if (!crossovers.empty()) {
    md << "\n### Crossover: the PS against all-reduce by table size\n\n"
       << "At each table size, the fastest PS run against the all-reduce run of the same model, link, workers and "
          "batch (samples/s):\n\n";
    for (const Crossover& c : crossovers) {
      md << "- " << c.verdict << ".\n";
      for (const CrossoverPoint& p : c.points) {
        md << "  - " << IdsText(p.table_ids) << ": " << p.ps_run << " " << Thousands(p.ps_samples_per_s) << ", "
           << p.allreduce_run << " " << Thousands(p.allreduce_samples_per_s) << " ("
           << Fixed(p.ps_samples_per_s / p.allreduce_samples_per_s, 2) << "x)\n";
      }
    }
  }
  if (std::any_of(runs.begin(), runs.end(), [](const RunReport& r) { return r.summary.has_final_test_auc(); })) {
    md << "\n![AUC vs samples](auc_vs_samples.png)\n![AUC vs time](auc_vs_time.png)\n";
  }
  return md.str();
}

std::string AucPlotScript(const std::string& title, const std::vector<RunReport>& runs, const std::string& dir) {
  std::ostringstream samples, time;
  size_t drawn = 0, count = 0;
  for (const auto& r : runs) {
    count += std::any_of(r.evals.begin(), r.evals.end(), [](const EvalPoint& p) { return !std::isnan(p.auc); }) ? 1 : 0;
  }
  if (count == 0) return "";
  for (const auto& r : runs) {
    const spec::RunSummary& s = r.summary;
    if (std::none_of(r.evals.begin(), r.evals.end(), [](const EvalPoint& p) { return !std::isnan(p.auc); })) continue;
    const std::string data = dir + "/plots/" + s.name() + ".auc.dat";
    std::ofstream d(data);
    d << "# samples wall_s test_auc\n";
    for (const auto& p : r.evals) {
      if (std::isnan(p.auc)) continue;
      d << static_cast<double>(p.step) * static_cast<double>(s.batch()) * s.workers() << " " << p.wall_s << " " << p.auc << "\n";
    }
    const PlotStyle st = RunPlotStyle(s, drawn, count);
    const std::string style = " with linespoints lc rgb '" + st.color + "' lw " + Fixed(st.width, 2) + " dt " +
                              (st.dashed ? "(16,8)" : "1") + " pt " + std::to_string(st.point) + " ps 1 title '" + s.name() + "'";
    samples << (drawn ? ", " : "") << "'" << data << "' using 1:3" << style;
    time << (drawn ? ", " : "") << "'" << data << "' using 2:3" << style;
    ++drawn;
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo size 960," << 560 + 20 * ((drawn + 2) / 3) << " noenhanced\nset grid\n"
     << "set key below maxcols 3 width 2\nset ylabel 'test AUC'\nset yrange [*:*]\nset xrange [*:*]\n"
     << "set output '" << dir << "/auc_vs_samples.png'\nset title '" << title << ": test AUC vs samples'\n"
     << "set xlabel 'samples (all workers)'\nplot " << samples.str() << "\n"
     << "set output '" << dir << "/auc_vs_time.png'\nset title '" << title << ": test AUC vs wall time'\n"
     << "set xlabel 'wall time (s)'\nplot " << time.str() << "\n";
  return gp.str();
}

}  // namespace gradsync
