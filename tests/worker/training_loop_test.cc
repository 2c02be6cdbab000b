// TrainingLoop over a fake GradientSync: the order of the calls in a step, the evaluation
// schedule, divergence (nothing of a diverged step reaches the sync), and retries after a
// recovery.
#include "worker/loop/training_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/data/synthetic.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

// Records every call as a line ("begin 3", "wait 0", "ready 2", "finish 3", ...).
class FakeSync final : public GradientSync {
 public:
  explicit FakeSync(Model* model, int size = 1) : model_(model), size_(size) {}

  int rank() const override { return 0; }
  int size() const override { return size_; }
  Result<int64_t> Start(const JobShape& shape) override {
    shape_ = shape;
    calls.push_back("start");
    return start_step;
  }
  Status BeginStep(const StepPlan& plan) override {
    step_ = plan.step;
    calls.push_back("begin " + std::to_string(plan.step) + (plan.evaluate ? " eval" : ""));
    if (fail_begin_at == plan.step && fail_begin_times > 0) {
      --fail_begin_times;
      return UnavailableError("server 1 restarted");
    }
    return OkStatus();
  }
  Status WaitParams(size_t t) override {
    calls.push_back("wait " + std::to_string(t));
    return OkStatus();
  }
  Status GradReady(size_t t) override {
    calls.push_back("ready " + std::to_string(t));
    return OkStatus();
  }
  Result<SyncStepStats> FinishStep() override {
    calls.push_back("finish " + std::to_string(step_));
    if (fail_finish_at == step_ && fail_finish_times > 0) {
      --fail_finish_times;
      return UnavailableError("push lost");
    }
    if (poison_at == step_) {  // the next step's loss is not finite
      for (float& p : model_->params()) p = std::numeric_limits<float>::quiet_NaN();
    }
    SyncStepStats s;
    s.comm_ms = 1;
    s.version_lag = 2;
    return s;
  }
  void AbandonStep() override { calls.push_back("abandon " + std::to_string(step_)); }
  Status Recover(const Status& failure) override {
    calls.push_back("recover " + std::to_string(step_));
    return recoverable ? OkStatus() : failure;
  }
  Status EndTraining(bool evaluate) override {
    calls.push_back(std::string("end") + (evaluate ? " eval" : ""));
    return OkStatus();
  }

  std::vector<std::string> calls;
  JobShape shape_;
  int64_t start_step = 0;
  int64_t fail_begin_at = -1, fail_finish_at = -1, poison_at = -1;
  int fail_begin_times = 0, fail_finish_times = 0;
  bool recoverable = true;

 private:
  Model* model_;
  int size_;
  int64_t step_ = -1;
};

struct Job {
  Dataset data;
  std::unique_ptr<Model> model;
};

Job MakeSetup(int64_t n = 200) {
  Job s;
  BlobsOptions bo;
  bo.n = n;
  bo.dim = 8;
  bo.classes = 3;
  s.data = MakeGaussianBlobs(bo);
  ModelOptions mo;
  mo.name = "mlp";
  mo.input_dim = 8;
  mo.num_classes = 3;
  mo.hidden = {16};
  s.model = std::move(CreateModel(mo)).value();
  s.model->Initialize(0);
  return s;
}

TrainingLoopOptions Options(int64_t batch, int epochs) {
  TrainingLoopOptions o;
  o.train.batch = batch;
  o.train.epochs = epochs;
  o.train.report.log_every = 1;
  return o;
}

std::vector<std::string> CallsOfStep(const std::vector<std::string>& calls, int64_t step) {
  std::vector<std::string> out;
  bool in = false;
  for (const auto& c : calls) {
    if (c.rfind("begin ", 0) == 0) in = std::stoll(c.substr(6)) == step;
    if (c == "end" || c == "end eval") in = false;
    if (in) out.push_back(c);
  }
  return out;
}

TEST(TrainingLoopTest, EachStepBeginsWaitsInForwardOrderReportsInBackwardOrderThenFinishes) {
  Job s = MakeSetup();
  ASSERT_TRUE(s.model->waits_for_params());
  FakeSync sync(s.model.get());
  TrainingLoop loop(Options(50, 1), s.model.get(), &s.data, &s.data, nullptr, &sync);
  auto r = loop.Run();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ(sync.shape_.steps_per_epoch, 4);
  EXPECT_EQ(sync.shape_.total_steps, 4);
  EXPECT_EQ(sync.calls.front(), "start");
  EXPECT_EQ(sync.calls.back(), "end eval");
  const size_t tensors = s.model->layout().size();  // W1, b1, W2, b2
  for (int64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    const auto calls = CallsOfStep(sync.calls, step);
    ASSERT_EQ(calls.size(), 2 + 2 * tensors);
    EXPECT_EQ(calls.front(), "begin " + std::to_string(step));
    for (size_t t = 0; t < tensors; ++t) EXPECT_EQ(calls[1 + t], "wait " + std::to_string(t));
    // Backward reports every tensor once, layer by layer from the last (a weight and its bias).
    std::vector<size_t> ready;
    for (size_t t = 0; t < tensors; ++t) {
      ASSERT_EQ(calls[1 + tensors + t].rfind("ready ", 0), 0u) << calls[1 + tensors + t];
      ready.push_back(std::stoul(calls[1 + tensors + t].substr(6)));
    }
    for (size_t i = 1; i < ready.size(); ++i) EXPECT_GE(ready[i - 1] / 2, ready[i] / 2) << i;
    std::sort(ready.begin(), ready.end());
    for (size_t t = 0; t < tensors; ++t) EXPECT_EQ(ready[t], t);
    EXPECT_EQ(calls.back(), "finish " + std::to_string(step));
  }
  // The hooks are gone after Run.
  EXPECT_FALSE(s.model->grad_ready());
}

TEST(TrainingLoopTest, EvaluatesAtEpochEndsAndEveryNStepsOnTheEvaluatingWorkerOnly) {
  for (bool evaluates : {true, false}) {
    SCOPED_TRACE(evaluates);
    Job s = MakeSetup(400);
    FakeSync sync(s.model.get(), 2);  // 200 samples per worker: 8 steps of 25 per epoch
    TrainingLoopOptions o = Options(25, 2);
    o.evaluate = evaluates;
    o.train.report.eval_every = 3;
    testing::TempDir dir;
    std::vector<EpochReport> reports;
    {
      auto w = MetricsWriter::Open(dir.File("m.csv"), "t", 0);
      ASSERT_TRUE(w.ok());
      TrainingLoop loop(o, s.model.get(), &s.data, &s.data, &*w, &sync);
      auto r = loop.Run();
      ASSERT_TRUE(r.ok()) << r.status();
      reports = *r;
    }
    std::vector<std::string> begins;
    for (const auto& c : sync.calls) {
      if (c.find(" eval") != std::string::npos) begins.push_back(c);
    }
    if (evaluates) {
      // After 3 and 6 steps, the epoch's end (8), 9, 12, 15; the end (16) after EndTraining.
      EXPECT_EQ(begins, (std::vector<std::string>{"begin 3 eval", "begin 6 eval", "begin 8 eval", "begin 9 eval",
                                                  "begin 12 eval", "begin 15 eval", "end eval"}));
    } else {
      EXPECT_TRUE(begins.empty());
    }
    ASSERT_EQ(reports.size(), 2u);
    EXPECT_EQ(reports[0].steps, 8);
    EXPECT_EQ(reports[1].steps, 16);
    EXPECT_EQ(std::isnan(reports[1].test_accuracy), !evaluates);
    // Metrics: a row per step with what the sync reported; evaluation rows where evaluated.
    std::ifstream f(dir.File("m.csv"));
    std::string line;
    std::getline(f, line);
    std::vector<int64_t> eval_steps;
    int train_rows = 0;
    while (std::getline(f, line)) {
      auto v = SplitCsv(line);
      ASSERT_EQ(v.size(), static_cast<size_t>(kMetricsColumns));
      if (!v[kColTestAccuracy].empty()) {
        eval_steps.push_back(std::stoll(v[kColStep]));
      } else {
        ++train_rows;
        EXPECT_EQ(v[kColVersionLag], "2");
        EXPECT_EQ(std::stod(v[kColComm]), 1.0);
      }
    }
    EXPECT_EQ(train_rows, 16);
    if (evaluates) {
      EXPECT_EQ(eval_steps, (std::vector<int64_t>{3, 6, 8, 9, 12, 15, 16}));
    } else {
      EXPECT_TRUE(eval_steps.empty());
    }
  }
}

TEST(TrainingLoopTest, ADivergedStepStopsBeforeAnyGradientReachesTheSync) {
  Job s = MakeSetup();
  FakeSync sync(s.model.get());
  sync.poison_at = 1;  // step 2 computes on NaN parameters
  TrainingLoop loop(Options(50, 1), s.model.get(), &s.data, &s.data, nullptr, &sync);
  auto r = loop.Run();
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("training diverged"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("at step 2"), std::string::npos) << r.status();
  const auto calls = CallsOfStep(sync.calls, 2);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), "begin 2");
  EXPECT_EQ(calls.back(), "abandon 2");
  for (const auto& c : calls) {
    EXPECT_NE(c.rfind("ready", 0), 0u) << c;
    EXPECT_NE(c.rfind("finish", 0), 0u) << c;
  }
  EXPECT_NE(sync.calls.back(), "end eval");
}

TEST(TrainingLoopTest, AFailedStepIsRedoneOnceAfterRecovery) {
  // A failed BeginStep, then a failed FinishStep: each step is redone once, from BeginStep.
  for (bool at_finish : {false, true}) {
    SCOPED_TRACE(at_finish);
    Job s = MakeSetup();
    FakeSync sync(s.model.get());
    (at_finish ? sync.fail_finish_at : sync.fail_begin_at) = 2;
    (at_finish ? sync.fail_finish_times : sync.fail_begin_times) = 1;
    TrainingLoop loop(Options(50, 1), s.model.get(), &s.data, &s.data, nullptr, &sync);
    auto r = loop.Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->back().steps, 4);
    const auto calls = CallsOfStep(sync.calls, 2);
    EXPECT_EQ(std::count(calls.begin(), calls.end(), "begin 2"), 2);
    EXPECT_EQ(std::count(calls.begin(), calls.end(), "recover 2"), 1);
    EXPECT_EQ(std::count(calls.begin(), calls.end(), "finish 2"), at_finish ? 2 : 1);
    // Redone from the start: the second attempt waits for every parameter again.
    EXPECT_EQ(std::count(calls.begin(), calls.end(), "wait 0"), at_finish ? 2 : 1);
    int finishes = 0;
    for (const auto& c : sync.calls) finishes += c.rfind("finish", 0) == 0;
    EXPECT_EQ(finishes, 4 + (at_finish ? 1 : 0));
  }
}

TEST(TrainingLoopTest, AFailureRecoverCannotRepairEndsTheRun) {
  Job s = MakeSetup();
  FakeSync sync(s.model.get());
  sync.fail_begin_at = 1;
  sync.fail_begin_times = 1;
  sync.recoverable = false;
  TrainingLoop loop(Options(50, 1), s.model.get(), &s.data, &s.data, nullptr, &sync);
  auto r = loop.Run();
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(sync.calls.back(), "recover 1");
}

TEST(TrainingLoopTest, StartsWhereTheSyncSays) {
  Job s = MakeSetup();
  FakeSync sync(s.model.get());
  sync.start_step = 6;  // 4 steps per epoch: the middle of epoch 2 of 3
  TrainingLoop loop(Options(50, 3), s.model.get(), &s.data, &s.data, nullptr, &sync);
  auto r = loop.Run();
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> begins;
  for (const auto& c : sync.calls) {
    if (c.rfind("begin", 0) == 0) begins.push_back(c);
  }
  EXPECT_EQ(begins, (std::vector<std::string>{"begin 6", "begin 7", "begin 8 eval", "begin 9", "begin 10", "begin 11"}));
  ASSERT_EQ(r->size(), 2u);  // epochs 2 and 3 (the first closed at step 8)
  EXPECT_EQ((*r)[0].epoch, 2);
  EXPECT_EQ((*r)[1].epoch, 3);
  EXPECT_EQ((*r)[1].steps, 12);
}

}  // namespace
}  // namespace gradsync
