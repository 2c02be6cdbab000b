// The report's part for runs with embedding tables: the numbers read from the processes' summaries,
// the crossover by table size per link, the table and the AUC plots.
#include "experiments/spec/tables_report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/obs/process_summary.h"
#include "experiments/spec/spec.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

RunReport TableRun(const std::string& name, const std::string& mode, int64_t ids, double samples_per_s,
                   const std::string& link = "") {
  RunReport r;
  spec::RunSummary& s = r.summary;
  s.set_name(name);
  s.set_mode(mode);
  s.set_model("dlrm");
  s.set_ok(true);
  s.set_workers(4);
  s.set_servers(mode == "allreduce" ? 0 : 2);
  s.set_link(link);
  s.set_batch(256);
  s.set_table_ids(ids);
  s.set_table_rows_per_step(1000);
  s.set_samples_per_s(samples_per_s);
  if (mode != "allreduce") s.set_server_table_rows(100000);
  return r;
}

TEST(CrossoverTest, ThePsOvertakesWhereItStaysAheadAtEveryLargerTable) {
  // The lead changes hands below 10^6: the crossover is where the PS stays ahead, not the first
  // size it leads at.
  std::vector<RunReport> runs = {
      TableRun("bsp-1e4", "bsp", 10000, 110), TableRun("ar-1e4", "allreduce", 10000, 100),
      TableRun("bsp-1e5", "bsp", 100000, 90),  TableRun("ar-1e5", "allreduce", 100000, 100),
      TableRun("bsp-1e6", "bsp", 1000000, 120), TableRun("asp-1e6", "asp", 1000000, 150),
      TableRun("ar-1e6", "allreduce", 1000000, 100), TableRun("bsp-1e7", "bsp", 10000000, 130),
      TableRun("ar-1e7", "allreduce", 10000000, 90),
  };
  const std::vector<Crossover> c = FindCrossovers(runs);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].link, "loopback");
  EXPECT_EQ(c[0].workers, 4);
  EXPECT_EQ(c[0].batch, 256);
  ASSERT_EQ(c[0].points.size(), 4u);
  EXPECT_EQ(c[0].crossover_ids, 1000000);
  EXPECT_EQ(c[0].points[2].ps_run, "asp-1e6");  // the fastest PS run at the size
  EXPECT_DOUBLE_EQ(c[0].points[2].touched_over_held, 0.01);
  EXPECT_NE(c[0].verdict.find("dlrm, loopback, 4 workers, batch 256: the PS overtakes all-reduce at 10^6 ids per table "
                              "(asp-1e6 1.50x ar-1e6; all-reduce ahead at 10^5, and the lead changed hands below)"),
            std::string::npos)
      << c[0].verdict;
}

TEST(CrossoverTest, EachLinkIsItsOwnGroupAndAOneSidedGroupSaysSo) {
  std::vector<RunReport> runs = {
      TableRun("bsp-1e4-slow", "bsp", 10000, 50, "100mbit"), TableRun("ar-1e4-slow", "allreduce", 10000, 20, "100mbit"),
      TableRun("bsp-1e4", "bsp", 10000, 90), TableRun("ar-1e4", "allreduce", 10000, 100),
      TableRun("bsp-1e8", "bsp", 100000000, 80), TableRun("ar-1e8", "allreduce", 100000000, 95),
      TableRun("bsp-1e8-slow", "bsp", 100000000, 40, "100mbit"),
      TableRun("ar-1e8-slow", "allreduce", 100000000, 10, "100mbit"),
  };
  RunReport failed = TableRun("ar-1e9", "allreduce", 1000000000, 1);
  failed.summary.set_ok(false);
  runs.push_back(failed);
  RunReport lone = TableRun("bsp-1e9", "bsp", 1000000000, 500);  // no all-reduce beside it: not a point
  runs.push_back(lone);
  // Another model's runs at the same link, workers and batch: a group of its own.
  RunReport slr_ps = TableRun("slr-bsp", "bsp", 1 << 20, 1000), slr_ar = TableRun("slr-ar", "allreduce", 1 << 20, 10);
  slr_ps.summary.set_model("sparse_logreg");
  slr_ar.summary.set_model("sparse_logreg");
  runs.push_back(slr_ps);
  runs.push_back(slr_ar);
  const std::vector<Crossover> c = FindCrossovers(runs);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].model, "sparse_logreg");
  ASSERT_EQ(c[2].points.size(), 1u);
  EXPECT_NE(c[2].verdict.find("sparse_logreg, loopback, 4 workers, batch 256: the PS is ahead"), std::string::npos)
      << c[2].verdict;
  EXPECT_EQ(c[0].link, "100mbit");
  EXPECT_EQ(c[0].crossover_ids, 0);
  EXPECT_NE(c[0].verdict.find("the PS is ahead at every table size measured (10^4 to 10^8 ids)"), std::string::npos);
  EXPECT_EQ(c[1].link, "loopback");
  ASSERT_EQ(c[1].points.size(), 2u);
  EXPECT_NE(c[1].verdict.find("all-reduce is ahead at every table size measured"), std::string::npos);
}

TEST(TablesSectionTest, OnlyRunsWithTablesAndTheCrossoverAndAucPlotsAreNamed) {
  RunReport dense;
  dense.summary.set_name("mlp-bsp");
  dense.summary.set_mode("bsp");
  dense.summary.set_ok(true);
  EXPECT_EQ(TablesSection({dense}), "");
  RunReport ssp = TableRun("ssp3", "ssp", 1000000, 120);
  ssp.summary.set_staleness_bound(3);
  ssp.summary.set_row_cache(true);
  ssp.summary.set_cache_hit_rate(0.063);
  ssp.summary.set_max_read_staleness(3);
  ssp.summary.set_final_test_auc(0.61234);
  const std::string md = TablesSection({dense, ssp, TableRun("ar", "allreduce", 1000000, 100)});
  EXPECT_EQ(md.find("mlp-bsp"), std::string::npos) << md;
  EXPECT_NE(md.find("| ssp3 | ssp | 3 | on | 2 | loopback | 10^6 | 256 | 0.6123 | 120 | 1,000 | — | 6.3% | 3 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("### Crossover"), std::string::npos);
  // sparse_logreg's 2^bits features read as a power of two.
  EXPECT_NE(TablesSection({TableRun("slr", "bsp", int64_t{1} << 20, 100)}).find("| loopback | 2^20 | 256 |"),
            std::string::npos);
  EXPECT_NE(md.find("auc_vs_samples.png"), std::string::npos);
}

TEST(AucPlotTest, SamplesAreStepsTimesBatchTimesWorkers) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/plots");
  RunReport r = TableRun("bsp", "bsp", 1000000, 100);
  r.evals = {{10, 0.1, 1.5, 0.7, 0.55}, {20, 0.2, 3.0, 0.7, 0.6}};
  RunReport no_auc = TableRun("mlp", "bsp", 0, 100);
  no_auc.evals = {{10, 0.1, 1.5, 0.7}};
  const std::string gp = AucPlotScript("t", {r, no_auc}, dir.path());
  EXPECT_NE(gp.find("auc_vs_samples.png"), std::string::npos);
  EXPECT_NE(gp.find("auc_vs_time.png"), std::string::npos);
  EXPECT_EQ(gp.find("mlp"), std::string::npos);
  std::ifstream d(dir.path() + "/plots/bsp.auc.dat");
  std::string header, line;
  std::getline(d, header);
  std::getline(d, line);
  EXPECT_EQ(line, "10240 1.5 0.55");
  EXPECT_EQ(AucPlotScript("t", {no_auc}, dir.path()), "");
}

TEST(TableNumbersTest, ReadFromEveryProcessSummary) {
  testing::TempDir dir;
  auto plan = ParseExperiment(R"(
name: "t"
defaults { workers: 2 servers: 2 train { model: "dlrm" click_ids: 100000 batch: 32 } }
run { name: "ssp2" train { mode: SSP staleness: 2 } }
run { name: "ssp2-off" train { mode: SSP staleness: 2 row_cache: false } }
)",
                              "t.textproto");
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int w = 0; w < 2; ++w) {
    summary::ProcessSummary s;
    s.set_role("worker");
    s.set_rank(w);
    s.set_steps(10);
    s.set_rows_pulled(300);
    s.set_cache_hits(100);
    s.set_max_read_staleness(w + 1);
    s.set_peak_rss_mib(100 + w);
    if (w == 0) s.set_final_test_auc(0.7);
    ASSERT_TRUE(WriteProcessSummary(dir.path(), s).ok());
  }
  for (int k = 0; k < 2; ++k) {
    summary::ProcessSummary s;
    s.set_role("server");
    s.set_rank(k);
    s.set_table_rows(1000 + k);
    s.set_table_mib(1.5);
    s.set_peak_rss_mib(50 - k);
    ASSERT_TRUE(WriteProcessSummary(dir.path(), s).ok());
  }
  spec::RunSummary s;
  ASSERT_TRUE(AddTableNumbers(plan->runs[0], dir.path(), {20, 4000}, s).ok());
  EXPECT_EQ(s.table_ids(), 100000);
  EXPECT_DOUBLE_EQ(s.table_rows_per_step(), 200);
  EXPECT_DOUBLE_EQ(s.rows_pulled_per_step(), 30);
  EXPECT_TRUE(s.row_cache());
  EXPECT_DOUBLE_EQ(s.cache_hit_rate(), 0.25);
  EXPECT_EQ(s.max_read_staleness(), 2);
  EXPECT_DOUBLE_EQ(s.final_test_auc(), 0.7);
  EXPECT_DOUBLE_EQ(s.worker_peak_rss_mib(), 101);
  EXPECT_DOUBLE_EQ(s.server_peak_rss_mib(), 50);
  EXPECT_EQ(s.server_table_rows(), 2001);
  EXPECT_DOUBLE_EQ(s.server_table_mib(), 3.0);
  spec::RunSummary off;
  ASSERT_TRUE(AddTableNumbers(plan->runs[1], dir.path(), {20, 4000}, off).ok());
  EXPECT_FALSE(off.row_cache());
  EXPECT_FALSE(off.has_cache_hit_rate());
  // sparse_logreg's one table holds 2^feature_bits ids, whatever click_ids says.
  auto slr = ParseExperiment(R"(
name: "s"
defaults { workers: 2 servers: 2 train { model: "sparse_logreg" feature_bits: 12 } }
run { name: "bsp" train { mode: BSP } }
)",
                             "s.textproto");
  ASSERT_TRUE(slr.ok()) << slr.status();
  spec::RunSummary logreg;
  ASSERT_TRUE(AddTableNumbers(slr->runs[0], dir.path(), {20, 4000}, logreg).ok());
  EXPECT_EQ(logreg.table_ids(), 4096);
  // A run without tables (no rows in its metrics or summaries) gets none of the fields.
  testing::TempDir empty;
  spec::RunSummary none;
  ASSERT_TRUE(AddTableNumbers(plan->runs[0], empty.path(), {20, 0}, none).ok());
  EXPECT_FALSE(none.has_table_rows_per_step());
  EXPECT_FALSE(none.has_table_ids());
}

}  // namespace
}  // namespace gradsync
