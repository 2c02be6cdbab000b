// The plots' script: staleness as a CDF per run with the ssp bound marked, one colour per mode,
// compressed runs dashed, earlier curves wider (coinciding curves stay visible).
#include "experiments/spec/progress.h"
#include "experiments/spec/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/obs/metrics.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

RunReport MakeRun(const std::string& name, const std::string& mode, const std::string& compression,
              std::map<int64_t, int64_t> staleness = {}, int bound = -1) {
  RunReport r;
  r.summary.set_name(name);
  r.summary.set_mode(mode);
  r.summary.set_compression(compression);
  if (bound >= 0) r.summary.set_staleness_bound(bound);
  r.evals = {{100, 1.0, 2.0, 0.8}, {200, 2.0, 4.0, 0.85}};
  r.clock_staleness = staleness;
  r.version_lag = staleness;
  return r;
}

std::vector<std::pair<double, double>> ReadPairs(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::vector<std::pair<double, double>> out;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    double a = 0, b = 0;
    s >> a >> b;
    out.push_back({a, b});
  }
  return out;
}

TEST(PlotTest, StalenessIsACdfPerRunWithTheSspBoundMarked) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/plots");
  Experiment e;
  e.name = "plots";
  // A sparse histogram (nothing between 3 and 72): the CDF steps flat across the gap.
  const std::vector<RunReport> runs = {MakeRun("bsp", "bsp", "none", {{0, 40}}),
                                       MakeRun("ssp3", "ssp", "none", {{0, 10}, {2, 20}, {3, 10}}, 3),
                                       MakeRun("asp-topk", "asp", "topk:0.01", {{0, 5}, {3, 5}, {72, 10}}),
                                       MakeRun("allreduce", "allreduce", "none")};
  const std::string gp = PlotScript(e, runs, dir.path());
  const auto asp = ReadPairs(dir.path() + "/plots/asp-topk.clock_staleness.dat");
  ASSERT_EQ(asp.size(), 4u);
  EXPECT_EQ(asp.front(), (std::pair<double, double>{-1, 0}));
  EXPECT_EQ(asp[1], (std::pair<double, double>{0, 0.25}));
  EXPECT_EQ(asp[2], (std::pair<double, double>{3, 0.5}));
  EXPECT_EQ(asp.back(), (std::pair<double, double>{72, 1.0}));
  const auto bsp = ReadPairs(dir.path() + "/plots/bsp.clock_staleness.dat");
  EXPECT_EQ(bsp.back(), (std::pair<double, double>{0, 1.0}));  // bsp: a step to 1 at 0, in view
  EXPECT_NE(gp.find("with steps"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("with points"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set arrow from 3, graph 0 to 3, graph 1"), std::string::npos) << gp;  // ssp's bound
  EXPECT_NE(gp.find("s = 3 (ssp3)"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("set arrow from 0,"), std::string::npos) << gp;  // no bound for bsp or asp
}

// One rare large version lag (an asp straggler's 139) does not set the lag panel's axis: it ends
// at twice the largest p99 over the runs, so every curve keeps its width; the maxima are in
// the table.
TEST(PlotTest, TheVersionLagAxisEndsAtTwiceTheLargestP99) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/plots");
  Experiment e;
  e.name = "plots";
  const std::vector<RunReport> runs = {MakeRun("ssp3", "ssp", "none", {{0, 60}, {3, 40}}, 3),
                                       MakeRun("asp", "asp", "none", {{0, 50}, {1, 30}, {4, 19}, {139, 1}})};
  const std::string gp = PlotScript(e, runs, dir.path());
  EXPECT_NE(gp.find("set xrange [-0.5:8]\nset title 'version lag of applied gradients"), std::string::npos) << gp;
}

TEST(PlotTest, ModesHaveOneColourCompressedIsDashedAndEarlierCurvesAreWider) {
  spec::RunSummary bsp, bsp_topk, allreduce;
  bsp.set_mode("bsp");
  bsp.set_compression("none");
  bsp_topk.set_mode("bsp");
  bsp_topk.set_compression("topk:0.01+ef");
  allreduce.set_mode("allreduce");
  allreduce.set_compression("none");
  const PlotStyle a = RunPlotStyle(bsp, 0, 3), b = RunPlotStyle(bsp_topk, 1, 3), c = RunPlotStyle(allreduce, 2, 3);
  EXPECT_EQ(a.color, b.color);
  EXPECT_NE(a.color, c.color);
  EXPECT_FALSE(a.dashed);
  EXPECT_TRUE(b.dashed);
  EXPECT_GT(a.width, b.width);
  EXPECT_GT(b.width, c.width);  // all-reduce's curve, identical to bsp's, leaves bsp's showing
  EXPECT_NE(a.point, c.point);
}

// all-reduce's accuracy is bsp's up to a sum's order: drawn as a thin line with open circles
// over bsp's (which would otherwise hide under it), and the legend says so; a run that differs
// by more than a line's width is drawn as usual.
TEST(PlotTest, ACurveOnTopOfAnEarlierOneIsDrawnSoBothShowAndTheLegendSaysSo) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/plots");
  RunReport bsp = MakeRun("bsp", "bsp", "none"), allreduce = MakeRun("allreduce", "allreduce", "none"),
            asp = MakeRun("asp", "asp", "none");
  allreduce.evals[1].accuracy += 0.0002;  // 2 images in 10,000
  asp.evals[1].accuracy += 0.01;          // one point: visibly apart
  const std::string gp = PlotScript(Experiment{}, {bsp, allreduce, asp}, dir.path());
  EXPECT_NE(gp.find("lw 1 dt 1 pt 6 ps 2 title 'allreduce (= bsp, within 0.25)'"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("'asp (within"), std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'asp'"), std::string::npos) << gp;
}

// Runs 1.5 s to 30 s long: a linear axis would cram the fast ones into its left twentieth, so the
// time axis is logarithmic; the accuracy axis leaves a margin under the lowest point; the legend
// sits under the plot, where it covers no curve.
TEST(PlotTest, TheTimeAxisIsLogarithmicWhenRunsDifferManyFoldAndTheLegendIsBelow) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/plots");
  RunReport fast = MakeRun("bsp", "bsp", "none"), slow = MakeRun("bsp-topk", "bsp", "topk:0.01");
  fast.evals = {{100, 1.0, 1.5, 0.607}, {200, 2.0, 3.0, 0.84}};
  slow.evals = {{100, 1.0, 10.0, 0.70}, {200, 2.0, 30.0, 0.83}};
  std::string gp = PlotScript(Experiment{}, {fast, slow}, dir.path());
  EXPECT_NE(gp.find("set logscale x\nset xrange [1.2:37.5]\nset xtics (1, 2, 5, 10, 20)\n"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set yrange [55:85]"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set key below"), std::string::npos) << gp;
  EXPECT_NE(gp.find("dt (16,8)"), std::string::npos) << gp;  // top-k dashed, with dashes that show
  slow.evals = {{100, 1.0, 2.0, 0.70}, {200, 2.0, 4.0, 0.83}};  // within 3x: linear
  gp = PlotScript(Experiment{}, {fast, slow}, dir.path());
  EXPECT_EQ(gp.find("set logscale x"), std::string::npos) << gp;
}

// gradsync-run and gradsync-sim say where the pictures are.
TEST(PlotTest, PicturesTextNamesThePlotsAndEveryTimeline) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/accuracy_vs_time.png") << "x";
  std::ofstream(dir.path() + "/staleness.png") << "x";
  RunReport traced = MakeRun("bsp", "bsp", "none"), plain = MakeRun("asp", "asp", "none");
  traced.timeline = "timeline-bsp.png";
  EXPECT_EQ(PicturesText({traced, plain}, dir.path()),
            "plots: " + dir.path() + "/accuracy_vs_time.png, staleness.png\ntimeline of bsp: " + dir.path() + "/timeline-bsp.png\n");
  EXPECT_EQ(PicturesText({plain}, dir.path() + "/none"), "");
}

TEST(PlotTest, NothingEvaluatedMeansNoScript) {
  testing::TempDir dir;
  RunReport r;
  r.summary.set_name("x");
  EXPECT_EQ(PlotScript(Experiment{}, {r}, dir.path()), "");
}

// Worker 0's metrics file and a progress line following it (no terminal here: a line for each
// new note).
class ProgressLineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = MetricsWriter::Open(csv_, "r", 0);
    ASSERT_TRUE(w.ok()) << w.status();
    writer_.emplace(std::move(*w));
  }
  void Write(const MetricsRow& row) { ASSERT_TRUE(writer_->Write(row).ok()); }

  testing::TempDir dir_;
  std::string csv_ = dir_.File("worker-0.csv");
  std::optional<MetricsWriter> writer_;
  std::ostringstream out_;
  ProgressLine progress_{out_, "[1/1] r", /*epochs=*/0, /*max_steps=*/20, csv_};
};

// The progress line says the workers are evaluating once training is done and the last
// evaluation has not come, instead of showing the last accuracy (or none) as if stuck.
TEST_F(ProgressLineTest, SaysTheWorkersAreEvaluatingAfterTheLastStep) {
  std::ostringstream& out = out_;
  MetricsRow row;
  row.step = 10;
  Write(row);
  progress_.SetNote("a");  // a new note prints a line at once (no terminal here)
  progress_.Tick();
  EXPECT_EQ(out.str().find("(evaluating)"), std::string::npos) << out.str();
  row.step = 20;  // the last step
  Write(row);
  progress_.SetNote("b");
  progress_.Tick();
  EXPECT_NE(out.str().find("step 20  test acc \u2014 (evaluating)"), std::string::npos) << out.str();
  row.test.accuracy = 0.5;  // the evaluation row
  Write(row);
  out.str("");
  progress_.SetNote("c");
  progress_.Tick();
  EXPECT_NE(out.str().find("step 20  test acc 50.00%  "), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("(evaluating)"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("AUC"), std::string::npos) << out.str();  // a classifier of classes has none
}

// A model that scores by a probability (dlrm): its test AUC beside the accuracy, on the progress
// line and the last line.
TEST_F(ProgressLineTest, ShowsTheTestAucWhereTheModelHasOne) {
  std::ostringstream& out = out_;
  MetricsRow row;
  row.step = 10;
  row.test.accuracy = 0.75;
  row.test.auc = 0.61234;
  Write(row);
  progress_.SetNote("a");
  progress_.Tick();
  EXPECT_NE(out.str().find("test acc 75.00%  AUC 0.6123  "), std::string::npos) << out.str();
  progress_.Done(OkStatus());
  EXPECT_NE(out.str().find("done in 0 s, test accuracy 75.00%, test AUC 0.6123"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace gradsync
