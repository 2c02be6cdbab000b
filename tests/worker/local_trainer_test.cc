#include "worker/loop/epoch.h"
#include "worker/loop/local_trainer.h"
#include "worker/sync/local_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/data/synthetic.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

// Evaluation rows (test_accuracy filled) of a metrics file, as their step numbers.
std::vector<int64_t> EvaluationSteps(const std::string& path, int* rows) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  std::vector<int64_t> steps;
  *rows = 0;
  while (std::getline(f, line)) {
    ++*rows;
    auto v = SplitCsv(line);
    if (v.size() == kMetricsColumns && !v[kColTestAccuracy].empty()) steps.push_back(std::stoll(v[kColStep]));
  }
  return steps;
}

struct Fixture {
  Dataset train, test;
  std::unique_ptr<Model> model;
};

Fixture MakeSetup() {
  Fixture s;
  BlobsOptions bo;
  bo.n = 1200;
  bo.dim = 16;
  bo.classes = 3;
  bo.center_scale = 0.8f;
  Dataset all = MakeGaussianBlobs(bo);
  s.train = all;
  s.test = all;
  ModelOptions mo;
  mo.name = "mlp";
  mo.input_dim = 16;
  mo.num_classes = 3;
  mo.hidden = {32};
  s.model = std::move(CreateModel(mo)).value();
  s.model->Initialize(0);
  return s;
}

TEST(LocalTrainerTest, TrainsAndReportsEachEpoch) {
  Fixture s = MakeSetup();
  LocalTrainOptions o;
  o.batch = 50;
  o.epochs = 3;
  o.lr = {LrSchedule::Kind::kCosine, 0.1f, 0, 0.0f};
  o.optimizer.momentum = 0.9f;
  o.report.log_every = 10;
  testing::TempDir dir;
  auto w = MetricsWriter::Open(dir.File("worker-0.csv"), "t", 0);
  ASSERT_TRUE(w.ok());
  LocalTrainer trainer(o, s.model.get(), &s.train, &s.test, &*w);
  int calls = 0;
  auto reports = trainer.Run([&](const EpochReport&) { ++calls; });
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 3u);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(reports->back().steps, 3 * 24);
  EXPECT_GT(reports->back().test_accuracy, 0.9);
  EXPECT_LT(reports->back().train_loss, reports->front().train_loss);
  EXPECT_GT(reports->back().samples_per_s, 0.0);
  ASSERT_TRUE(w->Flush().ok());
  std::ifstream f(dir.File("worker-0.csv"));
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, MetricsWriter::kHeader);
  int rows = 0;
  EXPECT_EQ(EvaluationSteps(dir.File("worker-0.csv"), &rows), (std::vector<int64_t>{24, 48, 72}));
  EXPECT_EQ(rows, 3 + 72 / 10);
}

TEST(LocalTrainerTest, EvaluatesEveryNStepsBetweenEpochs) {
  Fixture s = MakeSetup();
  LocalTrainOptions o;
  o.batch = 50;
  o.epochs = 2;
  o.lr = {LrSchedule::Kind::kConstant, 0.1f, 0, 0.0f};
  o.report.log_every = 0;
  o.report.eval_every = 10;
  testing::TempDir dir;
  {
    auto w = MetricsWriter::Open(dir.File("worker-0.csv"), "t", 0);
    ASSERT_TRUE(w.ok());
    LocalTrainer trainer(o, s.model.get(), &s.train, &s.test, &*w);
    ASSERT_TRUE(trainer.Run().ok());
  }
  int rows = 0;
  // Every 10 steps, and at each epoch's end (24 steps per epoch) exactly once.
  EXPECT_EQ(EvaluationSteps(dir.File("worker-0.csv"), &rows), (std::vector<int64_t>{10, 20, 24, 30, 40, 48}));
}

TEST(LocalTrainerTest, AccumulatedMicroBatchesEqualOneLargeBatch) {
  auto run = [](int64_t batch, int64_t micro) {
    Fixture s = MakeSetup();
    LocalTrainOptions o;
    o.batch = batch;
    o.micro_batch = micro;
    o.epochs = 2;
    o.report.log_every = 0;
    o.lr = {LrSchedule::Kind::kCosine, 0.05f, 0, 0.0f};  // the rate of the other equivalence tests
    o.optimizer.momentum = 0.9f;
    LocalTrainer trainer(o, s.model.get(), &s.train, &s.test, nullptr);
    EXPECT_TRUE(trainer.Run().ok());
    return std::vector<float>(s.model->params().begin(), s.model->params().end());
  };
  // One step: the accumulated gradient is the batch's gradient up to float summation order;
  // 50 = 16 + 16 + 16 + 2, so unequal micro-batches must be weighted by their size.
  {
    Fixture s = MakeSetup();
    std::vector<uint32_t> idx(50);
    for (uint32_t i = 0; i < 50; ++i) idx[i] = i * 7;
    BatchBuffer buffer, micro;
    const float loss = s.model->ForwardBackward(buffer.Gather(s.train, idx));
    const std::vector<float> grad(s.model->grads().begin(), s.model->grads().end());
    std::vector<float> acc;
    const float acc_loss = AccumulateGradients(*s.model, s.train, idx, 16, micro, acc);
    EXPECT_NEAR(acc_loss, loss, 1e-6 * std::fabs(loss));
    float scale = 0;
    for (float g : grad) scale = std::max(scale, std::fabs(g));
    // Relative to the gradient's scale: entries that cancel to near 0 carry absolute rounding.
    EXPECT_LE(MaxRelativeDiff(std::vector<float>(s.model->grads().begin(), s.model->grads().end()), grad, 1e-2 * scale), 1e-5);
  }
  // Whole runs stay together (the rounding differences grow a little over 48 momentum steps)
  // while a smaller batch is another run altogether.
  const auto whole = run(50, 0);
  EXPECT_LE(MaxRelativeDiff(run(50, 16), whole, 1e-3), 5e-5);
  EXPECT_LE(MaxRelativeDiff(run(50, 25), whole, 1e-3), 5e-5);
  EXPECT_GT(MaxRelativeDiff(run(25, 0), whole, 1e-3), 1e-2);
}

TEST(StragglerTest, ParsesEverySpecAndRejectsBadOnes) {
  EXPECT_EQ(ParseStraggler("none")->kind, StragglerSpec::Kind::kNone);
  EXPECT_EQ(ParseStraggler("ms:20")->a, 20);
  EXPECT_EQ(ParseStraggler("x:3")->kind, StragglerSpec::Kind::kMultiple);
  EXPECT_EQ(ParseStraggler("exp:5")->kind, StragglerSpec::Kind::kExponential);
  auto u = ParseStraggler("uniform:1:4");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->b, 4);
  for (const char* bad : {"ms", "ms:-1", "x:0.5", "uniform:4:1", "uniform:1", "slow:3", "ms:abc", "ms:1e9", "exp:nan"}) {
    EXPECT_FALSE(ParseStraggler(bad).ok()) << bad;
  }
}

TEST(StragglerTest, DelaysFollowTheirSpec) {
  Straggler fixed(*ParseStraggler("ms:7"), 0);
  EXPECT_EQ(fixed.DelayMs(100), 7);
  Straggler times3(*ParseStraggler("x:3"), 0);
  EXPECT_DOUBLE_EQ(times3.DelayMs(10), 20);  // the step takes 3x its compute
  Straggler none;
  EXPECT_EQ(none.DelayMs(10), 0);
  EXPECT_FALSE(none.active());
  // Seeded distributions: reproducible, inside their support, with the right mean.
  Straggler e1(*ParseStraggler("exp:4"), 11), e2(*ParseStraggler("exp:4"), 11);
  Straggler u(*ParseStraggler("uniform:2:6"), 3);
  double sum_e = 0, sum_u = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double a = e1.DelayMs(0);
    ASSERT_EQ(a, e2.DelayMs(0));
    ASSERT_GE(a, 0);
    sum_e += a;
    const double b = u.DelayMs(0);
    ASSERT_GE(b, 2);
    ASSERT_LE(b, 6);
    sum_u += b;
  }
  EXPECT_NEAR(sum_e / n, 4.0, 4.0 * 4 / std::sqrt(n));  // 4 standard errors
  EXPECT_NEAR(sum_u / n, 4.0, 4 * (4 / std::sqrt(12.0)) / std::sqrt(n));
  // Sleep sleeps at least what it reports.
  Straggler ms(*ParseStraggler("ms:5"), 0);
  EXPECT_GE(ms.Sleep(0), 5.0);
}

// A caller with its own schedule (a frontend) sets each step's rate; NaN keeps the run's.
TEST(LocalSyncTest, AStepsOwnRateReplacesTheSchedule) {
  Fixture s = MakeSetup();
  LocalTrainOptions o;
  o.lr = {LrSchedule::Kind::kConstant, 0.5f, 0, 0.0f};
  LocalSync sync(o, s.model.get());
  ASSERT_TRUE(sync.Start({10, 10}).ok());
  auto step = [&](float lr) -> Status {
    std::fill(s.model->grads().begin(), s.model->grads().end(), 1.0f);
    const float before = s.model->params()[0];
    StepPlan plan;
    plan.lr = lr;
    RETURN_IF_ERROR(sync.BeginStep(plan));
    RETURN_IF_ERROR(sync.FinishStep().status());
    EXPECT_FLOAT_EQ(s.model->params()[0], before - (std::isnan(lr) ? 0.5f : lr)) << lr;
    return OkStatus();
  };
  EXPECT_TRUE(step(0.125f).ok());
  EXPECT_TRUE(step(NAN).ok());
  EXPECT_TRUE(step(0.0f).ok());
  for (float bad : {-0.1f, INFINITY}) {
    StepPlan plan;
    plan.lr = bad;
    EXPECT_EQ(sync.BeginStep(plan).code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(LocalTrainerTest, LastPartialBatchAndMaxSteps) {
  Fixture s = MakeSetup();
  LocalTrainOptions o;
  o.batch = 500;  // 1200 = 500 + 500 + 200
  o.epochs = 2;
  LocalTrainer t1(o, s.model.get(), &s.train, &s.test, nullptr);
  auto r = t1.Run();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->back().steps, 6);
  o.max_steps = 4;
  LocalTrainer t2(o, s.model.get(), &s.train, &s.test, nullptr);
  r = t2.Run();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->back().steps, 4);
  EXPECT_EQ(r->size(), 2u);
}

TEST(LocalTrainerTest, DivergenceIsAnErrorNotAHang) {
  Fixture s = MakeSetup();
  LocalTrainOptions o;
  o.batch = 10;
  o.epochs = 5;
  o.lr.base = 1e30f;
  LocalTrainer t(o, s.model.get(), &s.train, &s.test, nullptr);
  auto r = t.Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("diverged"), std::string::npos);
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// fp16 with a loss scale far too large: the first steps overflow and are skipped, each halving
// the scale, until it fits; then training goes on. The metrics count the skips.
TEST(LocalTrainerTest, Fp16SkipsOverflowedStepsAndCountsThem) {
  Fixture s = MakeSetup();
  ModelOptions mo;
  mo.name = "mlp";
  mo.input_dim = 16;
  mo.num_classes = 3;
  mo.hidden = {32};
  mo.precision = Precision::kFp16;
  auto model = std::move(CreateModel(mo)).value();
  model->Initialize(0);
  LocalTrainOptions o;
  o.numerics.precision = Precision::kFp16;
  o.numerics.initial_loss_scale = 1e12f;
  o.batch = 32;
  o.epochs = 3;
  o.report.log_every = 1;
  o.lr = {LrSchedule::Kind::kConstant, 0.1f};
  o.optimizer.momentum = 0.9f;
  testing::TempDir dir;
  const std::string path = dir.path() + "/m.csv";
  auto writer = MetricsWriter::Open(path, "fp16", 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  LocalTrainer trainer(o, model.get(), &s.train, &s.test, &*writer);
  auto reports = trainer.Run(nullptr);
  ASSERT_TRUE(reports.ok()) << reports.status();
  EXPECT_GT(reports->back().test_accuracy, 0.9);
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  int64_t skipped = -1, steps = 0;
  double first_scale = 0, last_scale = 0;
  while (std::getline(f, line)) {
    auto v = SplitCsv(line);
    ASSERT_EQ(v.size(), static_cast<size_t>(kMetricsColumns));
    if (!v[kColTestAccuracy].empty()) continue;
    ++steps;
    const double scale = std::stod(v[kColLossScale]);
    if (steps == 1) first_scale = scale;
    last_scale = scale;
    const int64_t now = std::stoll(v[kColSkippedSteps]);
    EXPECT_GE(now, std::max<int64_t>(skipped, 0));  // cumulative
    skipped = now;
  }
  // 1e12 (2^39.9) needs some 24 halvings to reach the 2^16 or so that these gradients fit in.
  EXPECT_GT(skipped, 12);
  EXPECT_LT(skipped, 36);
  EXPECT_FLOAT_EQ(first_scale, 1e12f);
  EXPECT_LT(last_scale, 1e6);
  EXPECT_GT(steps, skipped + 20);  // and then it trained
}

}  // namespace
}  // namespace gradsync
