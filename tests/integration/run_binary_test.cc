// gradsync-run as a user runs it: a tiny spec end to end (every output file, numbers that agree
// with the metrics files), a bad spec, a run that fails, --dry-run, --only, Ctrl-C, and a run
// over emulated slow links.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "experiment.pb.h"
#include "experiments/process/process.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<std::string>> Rows(const std::string& csv) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) rows.push_back(SplitCsv(line));
  return rows;
}

std::string WriteSpec(const TempDir& dir, const std::string& text) {
  const std::string path = dir.File("spec.textproto");
  std::ofstream(path) << text;
  return path;
}

const char* kTiny = R"(
name: "tiny"
target_accuracy: 0.25
defaults { workers: 2 servers: 1 train { dataset: "blobs" hidden: "16" epochs: 1 batch: 16 max_steps: 60 lr: 0.1
           lr_schedule: "constant" eval_every: 20 log_every: 10 } }
run { name: "bsp" train { mode: BSP } }
run { name: "asp-slow" train { mode: ASP } straggler { worker: 1 fixed_ms: 2 } }
run { name: "ar-topk" train { mode: ALLREDUCE compress: "topk:0.1" error_feedback: true } }
)";

// Bytes are counted on every path: a dense run whose values go through shared memory (the PS's
// lanes, the all-reduce's group) reports what its formula says, the shared-memory part shown;
// over the wire alone, the same total.
TEST(RunBinaryTest, DenseRunsMoveTheirFormulasBytesOnEveryPath) {
  TempDir dir;
  const std::string out = dir.File("results");
  const char* spec = R"(
name: "bytes"
defaults { workers: 2 servers: 1 train { dataset: "blobs" hidden: "512,256" epochs: 1 batch: 16 max_steps: 60
           lr: 0.05 log_every: 10 } }
run { name: "bsp-shm" train { mode: BSP } }
run { name: "bsp-wire" train { mode: BSP shm: false } }
run { name: "ar-shm" train { mode: ALLREDUCE } }
run { name: "ar-wire" train { mode: ALLREDUCE allreduce_shm: false } }
)";
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, spec), "--out=" + out}, 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/bytes/summary.json"), &summary).ok());
  ASSERT_EQ(summary.run_size(), 4);
  for (const auto& run : summary.run()) {
    SCOPED_TRACE(run.name());
    ASSERT_TRUE(run.ok()) << run.error();
    ASSERT_TRUE(run.has_formula_bytes_per_step());
    EXPECT_NEAR(run.bytes_per_step(), run.formula_bytes_per_step(), 0.01 * run.formula_bytes_per_step());
    if (run.name().find("shm") != std::string::npos) {
      ASSERT_TRUE(run.has_shm_bytes_per_step());
      EXPECT_GT(run.shm_bytes_per_step(), 0.99 * run.formula_bytes_per_step());
    } else {
      EXPECT_FALSE(run.has_shm_bytes_per_step());
    }
  }
  const std::string md = ReadFile(out + "/bytes/summary.md");
  EXPECT_NE(md.find(" shm) |"), std::string::npos) << md;
}

TEST(RunBinaryTest, ATinySpecWritesEveryOutputWithConsistentNumbers) {
  TempDir dir;
  const std::string out = dir.File("results");
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, kTiny), "--out=" + out}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string exp = out + "/tiny";
  for (const char* f : {"summary.md", "summary.json", "accuracy_vs_time.png", "accuracy_vs_epoch.png", "staleness.png"}) {
    EXPECT_TRUE(fs::exists(exp + "/" + f) && fs::file_size(exp + "/" + f) > 0) << f;
  }
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(exp + "/summary.json"), &summary).ok());
  ASSERT_EQ(summary.run_size(), 3);
  const std::string md = ReadFile(exp + "/summary.md");
  for (const auto& run : summary.run()) {
    SCOPED_TRACE(run.name());
    const std::string rd = exp + "/" + run.name();
    EXPECT_TRUE(run.ok());
    EXPECT_EQ(run.steps(), 60);
    EXPECT_TRUE(fs::exists(rd + "/commands.txt"));
    EXPECT_EQ(run.commands_size(), run.mode() == "allreduce" ? 3 : 4);
    // The summary's numbers are the metrics file's.
    auto rows = Rows(rd + "/metrics.csv");
    ASSERT_FALSE(rows.empty());
    double last_acc = -1, last_wall = 0;
    int64_t first_at_target = -1;
    std::map<std::string, std::pair<int64_t, double>> last;  // worker -> (step, bytes)
    for (const auto& v : rows) {
      ASSERT_EQ(v.size(), static_cast<size_t>(kMetricsColumns));
      EXPECT_EQ(v[kColRun], run.name());
      if (v[kColWorker] == "0" && !v[kColTestAccuracy].empty()) {
        last_acc = std::stod(v[kColTestAccuracy]);
        last_wall = std::stod(v[kColWall]);
        if (first_at_target < 0 && last_acc >= 0.25) first_at_target = std::stoll(v[kColStep]);
      }
      const int64_t step = std::stoll(v[kColStep]);
      if (step >= last[v[kColWorker]].first) {
        // Every path: the wire and shared memory (the report's bytes/step counts both).
        last[v[kColWorker]] = {step, std::stod(v[kColBytesSent]) + std::stod(v[kColBytesReceived]) +
                                         std::stod(v[kColShmBytesSent]) + std::stod(v[kColShmBytesReceived])};
      }
      if (run.name() == "asp-slow" && v[kColWorker] == "1") {
        EXPECT_GE(std::stod(v[kColDelay]), 2.0);  // delay_ms recorded
      }
    }
    EXPECT_DOUBLE_EQ(run.final_test_accuracy(), last_acc);
    EXPECT_DOUBLE_EQ(run.wall_s(), last_wall);
    double bytes = 0, steps = 0;
    for (const auto& [w, sb] : last) bytes += sb.second, steps += static_cast<double>(sb.first);
    EXPECT_NEAR(run.bytes_per_step(), bytes / steps, 1e-6 * bytes / steps);
    EXPECT_GT(run.final_test_accuracy(), 0.25);  // 10 classes: chance is 0.1
    ASSERT_TRUE(run.has_steps_to_target());
    EXPECT_EQ(run.steps_to_target(), first_at_target);
    char acc[32];
    std::snprintf(acc, sizeof(acc), "%.2f%%", 100 * run.final_test_accuracy());
    EXPECT_NE(md.find("| " + run.name() + " | " + run.mode()), std::string::npos);
    EXPECT_NE(md.find(acc), std::string::npos) << acc;
    if (run.mode() == "allreduce") {
      EXPECT_FALSE(run.has_version_lag_p50());
      EXPECT_FALSE(run.has_clock_staleness_p50());
    } else {
      // The staleness percentiles are the server's histograms'.
      auto server = ReadProcessSummary(rd + "/server-0.json");
      ASSERT_TRUE(server.ok()) << server.status();
      Histogram lag, clock;
      AddHistogram(server->version_lag(), &lag);
      AddHistogram(server->clock_staleness(), &clock);
      ASSERT_FALSE(lag.empty());
      ASSERT_FALSE(clock.empty());
      EXPECT_EQ(run.version_lag_max(), lag.rbegin()->first);
      EXPECT_EQ(run.clock_staleness_max(), clock.rbegin()->first);
      EXPECT_EQ(run.clock_staleness_p50(), HistogramQuantile(clock, 0.5));
    }
    // The model size is worker 0's summary's.
    auto w0 = ReadProcessSummary(rd + "/worker-0.json");
    ASSERT_TRUE(w0.ok()) << w0.status();
    EXPECT_EQ(run.params(), w0->params());
    EXPECT_GT(run.params(), 0);
  }
  EXPECT_EQ(summary.run(0).version_lag_max(), 0);  // bsp
  EXPECT_EQ(summary.run(0).clock_staleness_max(), 0);
  EXPECT_NE(md.find("clock staleness p50/p99/max (clocks)"), std::string::npos);
  EXPECT_NE(md.find("version lag p50/p99/max (updates)"), std::string::npos);
}

// A spec on the DLRM-style model as experiments/specs/sparse.textproto runs it: every run's table
// numbers are its files' (rows per step the metrics' training rows, AUC worker 0's last
// evaluation, rows pulled the workers' summaries), bsp and all-reduce train the same model, ssp's
// cache is counted and bounded, and summary.md names the crossover and draws the AUC.
TEST(RunBinaryTest, ASparseSpecReportsItsTablesAndNamesTheCrossover) {
  TempDir dir;
  const std::string out = dir.File("results");
  const char* spec = R"(
name: "sparse"
defaults { workers: 2 servers: 1 train { model: "dlrm" click_features: 4 click_train: 4096 click_test: 1000
           table_dim: 8 epochs: 1 batch: 64 eval_every: 16 log_every: 4 } }
run { name: "bsp-1e3" train { mode: BSP click_ids: 1000 } }
run { name: "ar-1e3" servers: 0 train { mode: ALLREDUCE click_ids: 1000 } }
run { name: "bsp-1e6" train { mode: BSP click_ids: 1000000 } }
run { name: "ar-1e6" servers: 0 train { mode: ALLREDUCE click_ids: 1000000 } }
run { name: "ssp2-1e6" train { mode: SSP staleness: 2 click_ids: 1000000 } }
)";
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, spec), "--out=" + out}, 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string exp = out + "/sparse";
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(exp + "/summary.json"), &summary).ok());
  ASSERT_EQ(summary.run_size(), 5);
  std::map<std::string, spec::RunSummary> by_name;
  for (const auto& run : summary.run()) {
    SCOPED_TRACE(run.name());
    ASSERT_TRUE(run.ok()) << run.error();
    by_name[run.name()] = run;
    const std::string rd = exp + "/" + run.name();
    double rows = 0, steps = 0, last_auc = NAN;
    for (const auto& v : Rows(rd + "/metrics.csv")) {
      ASSERT_EQ(v.size(), static_cast<size_t>(kMetricsColumns));
      if (v[kColTestAccuracy].empty()) {
        rows += std::stod(v[kColTableRows]);
        steps += 1;
      } else if (v[kColWorker] == "0") {
        ASSERT_FALSE(v[kColTestAuc].empty());
        last_auc = std::stod(v[kColTestAuc]);
      }
    }
    ASSERT_TRUE(run.has_table_rows_per_step());
    EXPECT_DOUBLE_EQ(run.table_rows_per_step(), rows / steps);
    EXPECT_GT(run.table_rows_per_step(), 0);
    EXPECT_LE(run.table_rows_per_step(), 64 * 4);  // a batch's unique ids over 4 tables
    EXPECT_NEAR(run.final_test_auc(), last_auc, 1e-6);  // the metrics file holds 6 decimals
    EXPECT_EQ(run.batch(), 64);
    EXPECT_GT(run.worker_peak_rss_mib(), 0);
    if (run.mode() == "allreduce") {
      EXPECT_FALSE(run.has_rows_pulled_per_step());
      EXPECT_FALSE(run.has_server_table_rows());
      continue;
    }
    double pulled = 0, worker_steps = 0;
    for (int w = 0; w < 2; ++w) {
      auto ws = ReadProcessSummary(rd + "/worker-" + std::to_string(w) + ".json");
      ASSERT_TRUE(ws.ok()) << ws.status();
      pulled += static_cast<double>(ws->rows_pulled());
      worker_steps += static_cast<double>(ws->steps());
    }
    EXPECT_DOUBLE_EQ(run.rows_pulled_per_step(), pulled / worker_steps);
    auto server = ReadProcessSummary(rd + "/server-0.json");
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(run.server_table_rows(), server->table_rows());
    EXPECT_LE(run.server_table_rows(), run.table_ids() * 4);
    EXPECT_GT(run.server_peak_rss_mib(), 0);
  }
  // All-reduce and bsp apply the same mean gradient to the same rows: the same model.
  EXPECT_NEAR(by_name["bsp-1e3"].final_test_auc(), by_name["ar-1e3"].final_test_auc(), 0.005);
  EXPECT_NEAR(by_name["bsp-1e6"].final_test_auc(), by_name["ar-1e6"].final_test_auc(), 0.005);
  EXPECT_EQ(by_name["bsp-1e3"].table_ids(), 1000);
  const spec::RunSummary& ssp = by_name["ssp2-1e6"];
  EXPECT_TRUE(ssp.row_cache());
  ASSERT_TRUE(ssp.has_cache_hit_rate());
  EXPECT_LT(ssp.cache_hit_rate(), 1.0);
  EXPECT_LE(ssp.max_read_staleness(), 2);
  EXPECT_EQ(by_name["bsp-1e6"].max_read_staleness(), 0);
  const std::string md = ReadFile(exp + "/summary.md");
  EXPECT_NE(md.find("## Embedding tables"), std::string::npos) << md;
  EXPECT_NE(md.find("- dlrm, loopback, 2 workers, batch 64: "), std::string::npos) << md;
  EXPECT_NE(md.find("  - 10^3: "), std::string::npos) << md;
  EXPECT_NE(md.find("  - 10^6: "), std::string::npos) << md;
  for (const char* png : {"auc_vs_samples.png", "auc_vs_time.png"}) {
    EXPECT_TRUE(fs::exists(exp + "/" + png) && fs::file_size(exp + "/" + png) > 0) << png;
  }
}

// A run whose workers are a command (gradsync-worker itself, given no flags): the run's settings,
// its name and the stragglers reach it as variables, and the report reads its files as usual.
TEST(RunBinaryTest, ACommandRunGetsTheRunAsVariablesAndIsReported) {
  TempDir dir;
  const std::string out = dir.File("results");
  ProcessResult r = RunProcess(
      {BinaryPath("gradsync-run"),
       WriteSpec(dir, "name: \"cmd\"\n"
                      "run { name: \"asp-cmd\" workers: 2 servers: 1 command: \"" + BinaryPath("gradsync-worker") + "\"\n"
                      "      straggler { worker: 1 fixed_ms: 2 }\n"
                      "      train { mode: ASP dataset: \"blobs\" hidden: \"8\" epochs: 1 max_steps: 30 batch: 16 lr: 0.1\n"
                      "              nesterov: true eval_every: 10 log_every: 10 } }\n"),
       "--out=" + out},
      120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/cmd/summary.json"), &summary).ok());
  ASSERT_EQ(summary.run_size(), 1);
  const auto& run = summary.run(0);
  EXPECT_TRUE(run.ok()) << run.error();
  EXPECT_EQ(run.steps(), 30);
  EXPECT_TRUE(run.has_final_test_accuracy());
  EXPECT_TRUE(run.has_version_lag_max());
  ASSERT_EQ(run.commands_size(), 4);
  EXPECT_EQ(run.commands(2).rfind("GRADSYNC_SCHEDULER=127.0.0.1:", 0), 0u) << run.commands(2);
  for (const char* var : {" GRADSYNC_MODE=asp ", " GRADSYNC_RUN=asp-cmd ", " GRADSYNC_NESTEROV=true ", " GRADSYNC_MAX_STEPS=30 "}) {
    EXPECT_NE(run.commands(2).find(var), std::string::npos) << var;
  }
  EXPECT_EQ(run.commands(2).find("GRADSYNC_STRAGGLE"), std::string::npos);
  EXPECT_NE(run.commands(3).find(" GRADSYNC_STRAGGLE=ms:2 GRADSYNC_STRAGGLE_SEED=0 "), std::string::npos) << run.commands(3);
  bool delayed = false;
  for (const auto& v : Rows(out + "/cmd/asp-cmd/metrics.csv")) {
    EXPECT_EQ(v[kColRun], "asp-cmd");
    if (v[kColWorker] == "1" && v[kColTestAccuracy].empty()) delayed = delayed || std::stod(v[kColDelay]) >= 2.0;
  }
  EXPECT_TRUE(delayed);  // the straggler's delay reached worker 1
}

// --help: one usage line (the binary's own, with its positional argument) and an example
// variable the binary really has.
TEST(RunBinaryTest, HelpHasOneUsageLineAndARealExample) {
  for (const char* bin : {"gradsync-run", "gradsync-keygen"}) {
    ProcessResult r = RunProcess({BinaryPath(bin), "--help"}, 30);
    EXPECT_EQ(r.exit_code, 0) << bin;
    EXPECT_EQ(r.out.rfind("Usage: " + std::string(bin) + " ", 0), 0u) << r.out;
    EXPECT_EQ(r.out.find("Usage:"), r.out.rfind("Usage:")) << r.out;
    EXPECT_EQ(r.out.find("GRADSYNC_LR"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("GRADSYNC_LOG_LEVEL=debug"), std::string::npos) << r.out;
  }
}

TEST(RunBinaryTest, ABadSpecIsOneLineAndExitCode2) {
  TempDir dir;
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, "name: \"x\"\nrun { name: \"a\" train { mode: BSP\n staleness: 3 } }")}, 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "gradsync-run: error: " + dir.File("spec.textproto") + ":3:2: run 'a': staleness applies to mode SSP only (mode ASP is unbounded)\n");
  ProcessResult none = RunProcess({BinaryPath("gradsync-run")}, 30);
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("give the experiment spec"), std::string::npos);
}

TEST(RunBinaryTest, AFailingRunIsNamedTheOthersStillRunAndNothingIsLeftBehind) {
  TempDir dir;
  const std::string out = dir.File("results");
  // 'broken' fails after registration: its Fashion-MNIST directory does not exist.
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"),
                                WriteSpec(dir, "name: \"f\"\n"
                                               "defaults { workers: 2 train { dataset: \"blobs\" hidden: \"8\" epochs: 1 max_steps: 20 } }\n"
                                               "run { name: \"broken\" train { mode: BSP dataset: \"fashion-mnist\" data_dir: \"/nonexistent\" } }\n"
                                               "run { name: \"fine\" train { mode: ASP } }\n"),
                                "--out=" + out, "--heartbeat-timeout=3"},
                               120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("1 run(s) failed: broken"), std::string::npos) << r.err;
  EXPECT_NE(ReadFile(out + "/f/summary.md").find("FAILED"), std::string::npos);
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/f/summary.json"), &summary).ok());
  ASSERT_EQ(summary.run_size(), 2);
  EXPECT_FALSE(summary.run(0).ok());
  EXPECT_TRUE(summary.run(1).ok());
  ProcessResult ps = RunProcess({"/usr/bin/pgrep", "-f", "--", "--out=" + out}, 10);
  EXPECT_EQ(ps.exit_code, 1) << ps.out;
  // Running one run again keeps the other in the report, as it ended.
  const std::string broken_error = summary.run(0).error();
  ProcessResult again = RunProcess({BinaryPath("gradsync-run"), dir.File("spec.textproto"), "--out=" + out, "--only=fine"}, 120);
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
  spec::Summary after;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/f/summary.json"), &after).ok());
  ASSERT_EQ(after.run_size(), 2);
  EXPECT_EQ(after.run(0).name(), "broken");
  EXPECT_FALSE(after.run(0).ok());
  EXPECT_EQ(after.run(0).error(), broken_error);
  EXPECT_EQ(after.run(1).name(), "fine");
  EXPECT_TRUE(after.run(1).ok());
  EXPECT_EQ(after.run(1).steps(), 20);
  EXPECT_NE(ReadFile(out + "/f/summary.md").find("FAILED"), std::string::npos);
  // --report-only starts nothing and reports the folders as they are: with the earlier summary
  // gone, the broken run (its worker 0 never ended) is failed still, the fine one as it ran.
  std::filesystem::remove(out + "/f/summary.json");
  std::filesystem::remove(out + "/f/summary.md");
  ProcessResult report = RunProcess({BinaryPath("gradsync-run"), dir.File("spec.textproto"), "--out=" + out, "--report-only"}, 60);
  EXPECT_EQ(report.exit_code, 0) << report.out << report.err;
  EXPECT_NE(report.out.find("reported from"), std::string::npos) << report.out;
  spec::Summary reported;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/f/summary.json"), &reported).ok());
  ASSERT_EQ(reported.run_size(), 2);
  EXPECT_FALSE(reported.run(0).ok());
  EXPECT_NE(reported.run(0).error().find("did not end"), std::string::npos) << reported.run(0).error();
  EXPECT_TRUE(reported.run(1).ok());
  EXPECT_EQ(reported.run(1).steps(), 20);
  EXPECT_EQ(reported.run(1).bytes_per_step(), after.run(1).bytes_per_step());
  // Nothing to report from: said so, exit 1.
  ProcessResult none = RunProcess({BinaryPath("gradsync-run"), dir.File("spec.textproto"), "--out=" + dir.File("empty"), "--report-only"}, 60);
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("no run folder"), std::string::npos) << none.err;
}

TEST(RunBinaryTest, DryRunPrintsTheCommandsAndOnlySelects) {
  TempDir dir;
  const std::string out = dir.File("results");
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, kTiny), "--out=" + out, "--dry-run",
                                "--only=asp-slow"},
                               30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("# asp-slow"), std::string::npos);
  EXPECT_EQ(r.out.find("# bsp"), std::string::npos);
  EXPECT_NE(r.out.find("gradsync-worker"), std::string::npos);
  EXPECT_NE(r.out.find("--straggle=ms:2"), std::string::npos);
  EXPECT_FALSE(fs::exists(out + "/tiny/asp-slow/metrics.csv"));
  // A name the spec lacks is refused before anything is announced or started.
  ProcessResult bad = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, kTiny), "--only=bsp,nope", "--dry-run"}, 30);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("no run named 'nope' (its runs: bsp, asp-slow, ar-topk)"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
  // --auth-dir reaches every process of the run: the scheduler, the shards and the workers.
  ProcessResult keys = RunProcess({BinaryPath("gradsync-keygen"), dir.File("keys")}, 30);
  ASSERT_EQ(keys.exit_code, 0) << keys.err;
  ProcessResult secured = RunProcess({BinaryPath("gradsync-run"), WriteSpec(dir, kTiny), "--out=" + out, "--dry-run",
                                      "--only=asp-slow", "--auth-dir=" + dir.File("keys")},
                                     30);
  ASSERT_EQ(secured.exit_code, 0) << secured.err;
  size_t lines = 0, with_keys = 0;
  std::istringstream in(secured.out);
  for (std::string line; std::getline(in, line);) {
    if (line.find("gradsync-server") == std::string::npos && line.find("gradsync-worker") == std::string::npos) continue;
    ++lines;
    with_keys += line.find("--auth-dir=" + dir.File("keys")) != std::string::npos;
  }
  EXPECT_GT(lines, 2u);
  EXPECT_EQ(with_keys, lines) << secured.out;
}

TEST(RunBinaryTest, CtrlCStopsEveryProcess) {
  TempDir dir;
  const std::string out = dir.File("results");
  ProcessGroup group;
  ASSERT_TRUE(group.Spawn({"run", {BinaryPath("gradsync-run"),
                                   WriteSpec(dir, "name: \"long\"\nrun { name: \"a\" workers: 2 train { mode: BSP dataset: \"blobs\" hidden: \"8\" epochs: 1000 } }"),
                                   "--out=" + out},
                           dir.File("run.log")})
                  .ok());
  // Wait until the run has produced metrics, then interrupt.
  // Up to 60 s for the job to start training: on a loaded machine (another test run beside this
  // one) 10 s was not always enough.
  for (int i = 0; i < 1200 && !fs::exists(out + "/long/a/worker-0.csv"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(out + "/long/a/worker-0.csv"));
  ASSERT_TRUE(group.Signal("run", SIGINT).ok());
  auto code = group.WaitFor("run", 30);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 130) << ReadFile(dir.File("run.log"));
  ProcessResult ps = RunProcess({"/usr/bin/pgrep", "-f", "--", "--out=" + out}, 10);
  EXPECT_EQ(ps.exit_code, 1) << ps.out;
}

std::set<std::string> Namespaces() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) out.insert(e.path().filename().string());
  return out;
}

// The namespaces left behind since `before`: new ones whose gradsync-run (gsr<pid>x...) has
// exited. Another test's run, still going beside this one (ctest -j), owns its own.
std::set<std::string> LeftBehind(const std::set<std::string>& before) {
  std::set<std::string> out;
  for (const std::string& name : Namespaces()) {
    if (before.count(name) || name.rfind("gsr", 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(name.substr(3, name.find('x') - 3).c_str()));
    if (pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // its owner still runs
    out.insert(name);
  }
  return out;
}

TEST(RunBinaryTest, SlowLinksCapTheTrafficAndAreTornDown) {
  if (!CanEmulateLinks()) {
    GRADSYNC_SKIP_UNLESS_CI("link emulation needs root and iproute2");
  }
  TempDir dir;
  const std::string out = dir.File("results");
  const auto before = Namespaces();
  // 12,730 parameters: ~51 kB each way per step. At 10 Mbit/s a worker moves at most 1.25 MB/s
  // each way; on loopback this job moves tens of MB/s.
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"),
                                WriteSpec(dir, "name: \"slow\"\n"
                                               "run { name: \"bsp10\" workers: 2 servers: 1 link { rate: \"10mbit\" }\n"
                                               "      train { mode: BSP dataset: \"blobs\" hidden: \"16\" epochs: 1 max_steps: 40 batch: 16 } }\n"),
                                "--out=" + out},
                               120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(LeftBehind(before), std::set<std::string>{});  // torn down
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/slow/summary.json"), &summary).ok());
  const auto& run = summary.run(0);
  EXPECT_EQ(run.link(), "10mbit");
  EXPECT_NE(run.commands(0).find("ip netns exec"), std::string::npos);
  const double bytes_per_s = run.bytes_per_step() * static_cast<double>(run.steps()) / run.wall_s();
  EXPECT_LT(bytes_per_s, 1.3 * 2 * 10e6 / 8) << "the link did not shape the traffic";
  EXPECT_GT(bytes_per_s, 0.2 * 10e6 / 8);
}

// A link's TCP congestion control is set in every namespace, or left as the machine's, and
// either way said beside the commands; one the kernel does not offer fails the run, by name.
TEST(RunBinaryTest, TheLinksCongestionControlIsSetAndReported) {
  if (!CanEmulateLinks()) {
    GRADSYNC_SKIP_UNLESS_CI("link emulation needs root and iproute2");
  }
  std::string host = ReadFile("/proc/sys/net/ipv4/tcp_congestion_control");
  while (!host.empty() && host.back() == '\n') host.pop_back();
  TempDir dir;
  const std::string out = dir.File("results");
  const auto before = Namespaces();
  const std::string train = " train { mode: ASP dataset: \"blobs\" hidden: \"16\" epochs: 1 max_steps: 5 batch: 16 } }\n";
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"),
                                WriteSpec(dir, "name: \"cc\"\n"
                                               "run { name: \"reno\" workers: 1 servers: 1 link { rate: \"1gbit\" congestion_control: \"reno\" }" + train +
                                               "run { name: \"machine\" workers: 1 servers: 1 link { rate: \"1gbit\" }" + train +
                                               "run { name: \"missing\" workers: 1 servers: 1 link { rate: \"1gbit\" congestion_control: \"nosuchcc\" }" + train),
                                "--out=" + out},
                               120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // the third run fails
  EXPECT_NE(r.out.find("TCP congestion control 'nosuchcc' is not available here (available: "), std::string::npos) << r.out;
  spec::Summary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(out + "/cc/summary.json"), &summary).ok());
  ASSERT_EQ(summary.run_size(), 3);
  EXPECT_TRUE(summary.run(0).ok()) << summary.run(0).error();
  EXPECT_EQ(summary.run(0).link(), "1gbit reno");
  EXPECT_EQ(summary.run(0).commands(summary.run(0).commands_size() - 1), "# links: 1gbit reno, TCP congestion control reno");
  EXPECT_TRUE(summary.run(1).ok()) << summary.run(1).error();
  EXPECT_EQ(summary.run(1).link(), "1gbit");
  EXPECT_EQ(summary.run(1).commands(summary.run(1).commands_size() - 1), "# links: 1gbit, TCP congestion control " + host);
  EXPECT_FALSE(summary.run(2).ok());
  EXPECT_EQ(LeftBehind(before), std::set<std::string>{});  // the failed run's too
}

}  // namespace
}  // namespace gradsync::testing
