#include "worker/local_trainer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/synthetic.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

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
  o.log_every = 10;
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
  int rows = 0, eval_rows = 0;
  std::getline(f, line);
  EXPECT_EQ(line, MetricsWriter::kHeader);
  while (std::getline(f, line)) {
    ++rows;
    if (line.back() != ',') ++eval_rows;  // test_accuracy filled
  }
  EXPECT_EQ(eval_rows, 3);
  EXPECT_EQ(rows, 3 + 72 / 10);
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
