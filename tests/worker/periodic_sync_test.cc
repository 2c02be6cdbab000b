// PeriodicSync (local SGD, DiLoCo) over a fake outer exchange: which steps begin and finish a
// round, what an evaluation within a round sees, and a round's push redone after a recovery.
#include "worker/sync/periodic_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/data/synthetic.h"
#include "worker/sync/local_sync.h"
#include "worker/loop/training_loop.h"

namespace gradsync {
namespace {

// One worker's outer exchange: FinishStep applies the outer SGD at rate 1 to the pseudo-gradient
// (the global model becomes the worker's own); records "begin R", "wait T", "finish R".
class FakeOuter final : public GradientSync {
 public:
  explicit FakeOuter(Model* global) : global_(global) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Result<int64_t> Start(const JobShape& shape) override {
    shape_ = shape;
    return int64_t{0};
  }
  Status BeginStep(const StepPlan& plan) override {
    round_ = plan.step;
    calls.push_back("begin " + std::to_string(plan.step));
    return OkStatus();
  }
  Status WaitParams(size_t) override { return OkStatus(); }
  Status GradReady(size_t) override { return OkStatus(); }
  Result<SyncStepStats> FinishStep() override {
    calls.push_back("finish " + std::to_string(round_));
    if (fail_finish_of_round == round_ && fail_times-- > 0) return UnavailableError("push lost");
    for (int64_t i = 0; i < global_->num_params(); ++i) global_->params()[i] -= global_->grads()[i];
    SyncStepStats s;
    s.comm_ms = 1;
    s.bytes_sent = static_cast<uint64_t>(++pushes) * 100;
    return s;
  }
  void AbandonStep() override {}
  Status Recover(const Status&) override {
    calls.push_back("recover " + std::to_string(round_));
    return OkStatus();
  }
  Status EndTraining(bool) override { return OkStatus(); }

  std::vector<std::string> calls;
  JobShape shape_;
  int64_t fail_finish_of_round = -1;
  int fail_times = 0;
  int pushes = 0;

 private:
  Model* global_;
  int64_t round_ = -1;
};

struct Rig {
  Dataset data;
  std::unique_ptr<Model> model;
  LocalTrainOptions train;
};

Rig MakeSetup(int64_t every) {
  Rig s;
  BlobsOptions bo;
  bo.n = 200;
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
  s.train.batch = 50;  // 4 steps an epoch
  s.train.epochs = 3;
  s.train.lr = {LrSchedule::Kind::kConstant, 0.1f, 0, 0.0f};
  s.train.periodic.every = every;
  return s;
}

PeriodicSync MakeSync(Rig& s, FakeOuter** outer) {
  return PeriodicSync(s.train, s.model.get(), std::make_unique<LocalSync>(s.train, s.model.get()),
                      [outer](Model* global, const LocalTrainOptions& o) -> std::unique_ptr<GradientSync> {
                        EXPECT_EQ(o.lr.base, 1.0f);
                        EXPECT_EQ(o.optimizer.momentum, 0.0f);
                        auto made = std::make_unique<FakeOuter>(global);
                        *outer = made.get();
                        return made;
                      });
}

std::vector<float> Params(const Model& m) { return {m.params().begin(), m.params().end()}; }

TEST(PeriodicSyncTest, RoundsOfHStepsTheLastOneShorter) {
  Rig s = MakeSetup(5);
  FakeOuter* outer = nullptr;
  PeriodicSync sync = MakeSync(s, &outer);
  TrainingLoopOptions lo;
  lo.train = s.train;
  TrainingLoop loop(lo, s.model.get(), &s.data, &s.data, nullptr, &sync);
  auto r = loop.Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->back().steps, 12);
  // 12 steps in rounds of 5: steps 0-4, 5-9, 10-11.
  EXPECT_EQ(outer->shape_.total_steps, 3);
  EXPECT_EQ(outer->calls, (std::vector<std::string>{"begin 0", "finish 0", "begin 1", "finish 1", "begin 2", "finish 2"}));
  EXPECT_TRUE(sync.rounds().EndsRound(4));
  EXPECT_FALSE(sync.rounds().EndsRound(5));
  EXPECT_TRUE(sync.rounds().EndsRound(11));
}

// The worker's own model trains within a round; an evaluation there sees the global model (the
// round's start), and the step computes on its own again afterwards.
TEST(PeriodicSyncTest, AnEvaluationWithinARoundSeesTheGlobalModel) {
  Rig s = MakeSetup(4);
  FakeOuter* outer = nullptr;
  PeriodicSync sync = MakeSync(s, &outer);
  ASSERT_TRUE(sync.Start({12, 4}).ok());
  const std::vector<float> start = Params(*s.model);
  BatchBuffer buffer;
  std::vector<float> acc;
  std::vector<uint32_t> idx(50);
  for (uint32_t i = 0; i < 50; ++i) idx[i] = i;
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(sync.BeginStep({.step = step}).ok());
    ComputeGradients(*s.model, s.data, idx, 0, buffer, acc);
    ASSERT_TRUE(sync.FinishStep().ok());
  }
  const std::vector<float> own = Params(*s.model);
  ASSERT_NE(own, start);
  ASSERT_TRUE(sync.BeginStep({.step = 2, .evaluate = true}).ok());
  sync.BeginEvaluation();
  EXPECT_EQ(Params(*s.model), start);
  sync.EndEvaluation();
  EXPECT_EQ(Params(*s.model), own);
  ComputeGradients(*s.model, s.data, idx, 0, buffer, acc);
  ASSERT_TRUE(sync.FinishStep().ok());
  ASSERT_TRUE(sync.BeginStep({.step = 3}).ok());
  ComputeGradients(*s.model, s.data, idx, 0, buffer, acc);
  ASSERT_TRUE(sync.FinishStep().ok());
  // The round ended: the global model took the worker's (rate 1, one worker: g - (g - own), own
  // to rounding), and the next round starts from it; an evaluation at a round's start changes
  // nothing.
  const std::vector<float> after_round = Params(*s.model);
  ASSERT_TRUE(sync.BeginStep({.step = 4, .evaluate = true}).ok());
  const std::vector<float> round_start = Params(*s.model);
  EXPECT_LE(MaxRelativeDiff(round_start, after_round, 1e-3), 1e-6);
  sync.BeginEvaluation();
  EXPECT_EQ(Params(*s.model), round_start);
  sync.EndEvaluation();
  EXPECT_EQ(Params(*s.model), round_start);
  EXPECT_EQ(outer->calls, (std::vector<std::string>{"begin 0", "finish 0", "begin 1"}));
}

// A round's push that fails is redone after Recover: the outer step begins again, the step's
// inner update is not applied twice, and training ends where it would have without the failure.
TEST(PeriodicSyncTest, AFailedRoundPushIsRedoneWithoutApplyingTheStepTwice) {
  std::vector<float> expect;
  for (bool fail : {false, true}) {
    SCOPED_TRACE(fail);
    Rig s = MakeSetup(3);
    FakeOuter* outer = nullptr;
    PeriodicSync sync = MakeSync(s, &outer);
    if (fail) {
      outer->fail_finish_of_round = 1;
      outer->fail_times = 1;
    }
    TrainingLoopOptions lo;
    lo.train = s.train;
    TrainingLoop loop(lo, s.model.get(), &s.data, &s.data, nullptr, &sync);
    auto r = loop.Run();
    ASSERT_TRUE(r.ok()) << r.status();
    if (!fail) {
      expect = Params(*s.model);
      continue;
    }
    EXPECT_EQ(outer->calls, (std::vector<std::string>{"begin 0", "finish 0", "begin 1", "finish 1", "recover 1",
                                                      "begin 1", "finish 1", "begin 2", "finish 2", "begin 3",
                                                      "finish 3"}));
    EXPECT_EQ(Params(*s.model), expect);
  }
}

}  // namespace
}  // namespace gradsync
