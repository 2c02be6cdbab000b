// Local SGD and DiLoCo (--sync-every, worker/sync/periodic_sync.h) over the parameter server and
// all-reduce (threads over 127.0.0.1), against a reference written out here: N models trained
// on their shards, their pseudo-gradients averaged every H steps and the outer SGD applied.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/data/sampler.h"
#include "common/data/synthetic.h"
#include "tests/support/ps_job.h"
#include "worker/loop/epoch.h"
#include "worker/sync/periodic_sync.h"

namespace gradsync::testing {
namespace {

// Rounds of `train.periodic.every` steps by `workers` replicas, written out: every replica trains
// its shard with train's optimizer and schedule, then the global model takes the outer SGD's
// step on the rank-order mean of global - own (plain_average: becomes the replicas' mean, no
// optimizer), and every replica starts the next round from it.
// The largest difference between a and b over the largest magnitude in b: how far apart two
// parameter vectors are at the parameters' own scale (an element near 0 is not measured
// against itself, as MaxRelativeDiff's floor does).
double ScaledMaxDiff(ConstFloatSpan a, ConstFloatSpan b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// What both written-out references share: every worker's model and inner optimizer as the job
// builds them, the global model with the outer optimizer, and a worker's local step on the batch
// the job's sampler gives it.
struct ReferenceWorkers {
  ReferenceWorkers(const ModelOptions& mo, const LocalTrainOptions& t, int n, const Dataset& d)
      : train(t), workers(n), data(d), spe(StepsPerEpoch(d.n, n, t.batch)),
        total(std::min(spe * t.epochs, t.max_steps > 0 ? t.max_steps : spe * t.epochs)),
        lr(RunSchedule(t, total, spe)), outer_train(OuterTrainOptions(t)) {
    for (int r = 0; r < workers; ++r) {
      models.push_back(std::move(CreateModel(mo)).value());
      models.back()->Initialize(0);
      inner.emplace_back(train.optimizer, models.back()->num_params());
      inner.back().SetLayers(OptimizerLayers(models.back()->layout(), {0, models.back()->num_params()}));
    }
    global.assign(models[0]->params().begin(), models[0]->params().end());
    outer = std::make_unique<Optimizer>(outer_train.optimizer, static_cast<int64_t>(global.size()));
  }
  // Worker r's step `step`: the gradient of its batch, applied by its inner optimizer.
  void LocalStep(int r, int64_t step) {
    const int64_t epoch = step / spe, s = step % spe;
    const std::vector<uint32_t> order = ShardedSampler(data.n, workers, r, train.seed).EpochIndices(epoch);
    const auto [begin, end] = BatchRange(s, spe, train.batch, static_cast<int64_t>(order.size()));
    ComputeGradients(*models[r], data, std::span(order).subspan(begin, end - begin), 0, buffer, acc);
    ApplyGradients(*models[r], inner[r], lr.At(step));
  }
  // The outer step on `delta` (a pseudo-gradient, or their sum), scaled by 1 / workers.
  void OuterStep(std::span<const float> delta) {
    outer->Step(global, delta, outer_train.lr.base, 0, 1.0f / static_cast<float>(workers));
    outer->EndStep();
  }

  const LocalTrainOptions& train;
  const int workers;
  const Dataset& data;
  const int64_t spe, total;
  const LrSchedule lr;
  const LocalTrainOptions outer_train;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<Optimizer> inner;
  std::vector<float> global;
  std::unique_ptr<Optimizer> outer;
  BatchBuffer buffer;
  std::vector<float> acc;
};

std::vector<float> ReferenceRounds(const ModelOptions& mo, const LocalTrainOptions& train, int workers,
                                   const Dataset& data, bool plain_average = false) {
  ReferenceWorkers w(mo, train, workers, data);
  std::vector<float>& global = w.global;
  std::vector<float> mean(global.size());
  for (int64_t step = 0; step < w.total; ++step) {
    for (int r = 0; r < workers; ++r) w.LocalStep(r, step);
    if ((step + 1) % train.periodic.every != 0 && step + 1 != w.total) continue;
    if (plain_average) {  // no optimizer: the global model is the models' mean
      for (size_t i = 0; i < global.size(); ++i) {
        float sum = 0;
        for (int r = 0; r < workers; ++r) sum += w.models[r]->params()[i];
        global[i] = sum / static_cast<float>(workers);
      }
      for (auto& m : w.models) std::copy(global.begin(), global.end(), m->params().begin());
      continue;
    }
    std::fill(mean.begin(), mean.end(), 0.0f);
    for (int r = 0; r < workers; ++r) {
      for (size_t i = 0; i < mean.size(); ++i) mean[i] += global[i] - w.models[r]->params()[i];
    }
    w.OuterStep(mean);
    for (auto& m : w.models) std::copy(global.begin(), global.end(), m->params().begin());
  }
  return global;
}

LocalTrainOptions RoundsTrain(int64_t every, int64_t steps) {
  LocalTrainOptions t = SmallTrain(8, steps, 0.0f);
  t.periodic.every = every;
  return t;
}

// RoundsTrain with Adam inside at a constant rate of 0.005 (DiLoCo's inner optimizer).
LocalTrainOptions AdamRoundsTrain(int64_t every, int64_t steps) {
  LocalTrainOptions t = RoundsTrain(every, steps);
  t.optimizer = OptimizerOptions();
  t.optimizer.kind = OptimizerKind::kAdam;
  t.lr = {LrSchedule::Kind::kConstant, 0.005f, 0, 0.0f};
  return t;
}

ModelOptions Softmax() {
  ModelOptions mo = SmallMlp();
  mo.name = "softmax";
  return mo;
}

PsJobResult RunPs(ConsistencyMode mode, const LocalTrainOptions& t, int workers, const Dataset& data,
                  const ModelOptions& model = SmallMlp()) {
  PsJobOptions ps;
  ps.mode = mode;
  ps.num_servers = 2;
  ps.num_workers = workers;
  ps.model = model;
  ps.train = t;
  return RunPsJob(ps, data, data);
}

// H = 1 with plain SGD inside and the outer SGD at rate 1: every step the workers' updates are
// averaged into the global model, i.e. the mode's own training, to rounding: the update goes
// through the parameters (Δ = w - fl(w - lr·g) is lr·g rounded at w's scale, where the mode sums
// lr·g itself). After 60 steps at 4 workers that is 3.5e-7 of the parameters' scale for both
// models (asserted: 1e-6); element by element (MaxRelativeDiff, floor 1e-3) 1.4e-6 (softmax) and
// 2.7e-6 (MLP), under the 1e-5 the other equivalence tests allow.
class OneStepRoundsTest : public ::testing::TestWithParam<std::pair<std::string, double>> {};

TEST_P(OneStepRoundsTest, LocalSgdEqualsBspAndAllReduce) {
  const auto [model_name, tolerance] = GetParam();
  ModelOptions mo = SmallMlp();
  mo.name = model_name;
  const Dataset data = SmallBlobs();
  LocalTrainOptions plain = SmallTrain(8, 60, 0.0f);
  LocalTrainOptions rounds = plain;
  rounds.periodic.every = 1;
  PsJobResult bsp = RunPs(ConsistencyMode::kBsp, plain, 4, data, mo);
  ASSERT_TRUE(bsp.status.ok()) << bsp.status;
  PsJobResult local_sgd = RunPs(ConsistencyMode::kBsp, rounds, 4, data, mo);
  ASSERT_TRUE(local_sgd.status.ok()) << local_sgd.status;
  const double vs_bsp = MaxRelativeDiff(local_sgd.params, bsp.params, 1e-3);
  const double scaled_bsp = ScaledMaxDiff(local_sgd.params, bsp.params);
  RecordProperty("max_relative_diff_vs_bsp", std::to_string(vs_bsp));
  EXPECT_LE(vs_bsp, tolerance);
  EXPECT_LE(scaled_bsp, 1e-6);

  auto ar = RunAllreduceJob(4, mo, plain, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  auto ar_rounds = RunAllreduceJob(4, mo, rounds, data, 100 * sizeof(float));
  ASSERT_TRUE(ar_rounds.ok()) << ar_rounds.status();
  const double vs_ar = MaxRelativeDiff(*ar_rounds, *ar, 1e-3);
  const double scaled_ar = ScaledMaxDiff(*ar_rounds, *ar);
  RecordProperty("max_relative_diff_vs_allreduce", std::to_string(vs_ar));
  EXPECT_LE(vs_ar, tolerance);
  EXPECT_LE(scaled_ar, 1e-6);
  std::printf("%s: H=1 local SGD vs bsp %.3g (at the parameters' scale %.3g), vs all-reduce %.3g (%.3g)\n",
              model_name.c_str(), vs_bsp, scaled_bsp, vs_ar, scaled_ar);
}

INSTANTIATE_TEST_SUITE_P(Models, OneStepRoundsTest,
                         ::testing::Values(std::make_pair(std::string("softmax"), 1e-5),
                                           std::make_pair(std::string("mlp"), 1e-5)),
                         [](const auto& p) { return p.param.first; });

// Local SGD (outer SGD at rate 1, no momentum: the global model is the mean of the workers'),
// H = 4 over 50 steps (the last round two steps long), with momentum inside: bsp's shards and
// all-reduce's ranks end where the written-out rounds do.
TEST(PeriodicTest, LocalSgdAveragesTheWorkersModelsEveryHSteps) {
  const Dataset data = SmallBlobs();
  LocalTrainOptions t = RoundsTrain(4, 50);
  t.optimizer.momentum = 0.9f;
  const std::vector<float> expect = ReferenceRounds(SmallMlp(), t, 4, data);
  PsJobResult bsp = RunPs(ConsistencyMode::kBsp, t, 4, data);
  ASSERT_TRUE(bsp.status.ok()) << bsp.status;
  EXPECT_LE(MaxRelativeDiff(bsp.params, expect, 1e-3), 1e-5);
  // A round is one push of each worker to each shard: 13 rounds.
  for (const ServerStats& s : bsp.server_stats) EXPECT_EQ(s.requests.pushes, 4 * 13);
  auto ar = RunAllreduceJob(4, SmallMlp(), t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  EXPECT_LE(MaxRelativeDiff(*ar, expect, 1e-3), 1e-5);
  // Not the same as training without rounds.
  LocalTrainOptions every_step = t;
  every_step.periodic = PeriodicOptions();
  auto plain = RunAllreduceJob(4, SmallMlp(), every_step, data, 100 * sizeof(float));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_GT(MaxRelativeDiff(*ar, *plain, 1e-3), 1e-3);
}

// DiLoCo: Adam inside, Nesterov outside (rate 0.7, momentum 0.9), H = 8.
TEST(PeriodicTest, DiLoCoAppliesTheOuterNesterovStepToTheMeanPseudoGradient) {
  const Dataset data = SmallBlobs();
  LocalTrainOptions t = AdamRoundsTrain(8, 48);
  t.periodic.outer_lr = 0.7f;
  t.periodic.outer.momentum = 0.9f;
  t.periodic.outer.nesterov = true;
  const std::vector<float> expect = ReferenceRounds(SmallMlp(), t, 4, data);
  PsJobResult bsp = RunPs(ConsistencyMode::kBsp, t, 4, data);
  ASSERT_TRUE(bsp.status.ok()) << bsp.status;
  EXPECT_LE(MaxRelativeDiff(bsp.params, expect, 1e-3), 1e-5);
  auto ar = RunAllreduceJob(4, SmallMlp(), t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  EXPECT_LE(MaxRelativeDiff(*ar, expect, 1e-3), 1e-5);
  // The outer optimizer matters: local SGD's plain average ends elsewhere.
  LocalTrainOptions averaged = t;
  averaged.periodic.outer_lr = 1.0f;
  averaged.periodic.outer = OptimizerOptions();
  EXPECT_GT(MaxRelativeDiff(expect, ReferenceRounds(SmallMlp(), averaged, 4, data), 1e-3), 1e-3);
}

// DiLoCo's outer SGD at rate 1 without momentum is local SGD: the global model is the workers'
// mean, which the reference forms as a plain average here (no optimizer). Softmax regression
// with Adam inside, so that the rounding of the two ways of averaging stays at its own size.
TEST(PeriodicTest, DiLoCoWithOuterSgdAtRateOneIsTheModelsAverage) {
  const Dataset data = SmallBlobs();
  const LocalTrainOptions t = AdamRoundsTrain(5, 30);
  auto ar = RunAllreduceJob(2, Softmax(), t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  // Two replicas, averaged every 5 steps.
  const std::vector<float> average = ReferenceRounds(Softmax(), t, 2, data, /*plain_average=*/true);
  EXPECT_LE(MaxRelativeDiff(*ar, average, 1e-3), 1e-6);
}

// Workers that take their rounds' pushes in turns, in a fixed order: worker 0's push of round 0,
// worker 1's, ..., worker 0's push of round 1, ... The hook runs on each worker's thread before a
// step's compute, after its BeginStep: at a round's first step the worker has pulled the round
// and its push of the round before is acknowledged (PsSync waits for both), so that push's turn
// is over; before a round's last step (whose FinishStep pushes) it waits for its turn. Every
// worker pulls round 0 before any push. The last round's pushes (no hook after them) go in any
// order, once every earlier turn is over. What each worker pulls is then fixed: the global model
// after every push of the turns before its own (ssp(1) holds none of those pulls).
class RoundTurns {
 public:
  RoundTurns(int workers, int64_t every, int64_t steps)
      : workers_(workers), every_(every), steps_(steps), rounds_((steps + every - 1) / every) {}

  void BeforeCompute(int worker, int64_t step) {
    std::unique_lock lock(mu_);
    const int64_t round = step / every_;
    if (step % every_ == 0) {
      if (round == 0) {
        ++started_;  // round 0 pulled
      } else {
        ++done_;  // this worker's turn of round - 1 over
      }
      cv_.notify_all();
    }
    if (step % every_ != every_ - 1 && step + 1 != steps_) return;
    const int64_t turn = round + 1 == rounds_ ? round * workers_ : round * workers_ + worker;
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return started_ == workers_ && done_ >= turn; })) {
      stuck_ = true;  // the job goes on; its parameters will not be the turns'
    }
  }
  bool stuck() const { return stuck_; }

 private:
  const int workers_;
  const int64_t every_, steps_, rounds_;
  std::mutex mu_;
  std::condition_variable cv_;
  int started_ = 0;    // workers that pulled round 0
  int64_t done_ = 0;   // turns over
  bool stuck_ = false;
};

// The rounds of RoundTurns written out: each worker trains its round from what it pulled (the
// global model when its last turn ended) and, in turn, the global model takes the outer SGD's step
// on that worker's pseudo-gradient Δ = pulled − own, scaled by 1 / workers as an ssp or asp shard
// scales a push. The last round's pushes all land on the global model after every earlier turn
// (in any order: without momentum they commute).
std::vector<float> ReferenceTurns(const ModelOptions& mo, const LocalTrainOptions& train, int workers,
                                  const Dataset& data) {
  ReferenceWorkers w(mo, train, workers, data);
  const int64_t every = train.periodic.every;
  std::vector<std::vector<float>> pulled(static_cast<size_t>(workers), w.global);
  std::vector<float> delta(w.global.size());
  for (int64_t first = 0; first < w.total; first += every) {
    const bool last_round = first + every >= w.total;
    for (int r = 0; r < workers; ++r) {
      for (int64_t step = first; step < std::min(first + every, w.total); ++step) w.LocalStep(r, step);
      for (size_t i = 0; i < delta.size(); ++i) delta[i] = pulled[r][i] - w.models[r]->params()[i];
      w.OuterStep(delta);
      if (last_round) continue;
      pulled[r] = w.global;
      std::copy(w.global.begin(), w.global.end(), w.models[r]->params().begin());
    }
  }
  return w.global;
}

// asp and ssp over rounds: each worker pushes once per round, the shards count rounds (clocks,
// staleness), and training still converges; where the order is fixed, the shards end exactly where
// the written-out rounds do, so the outer step is applied to each pushed pseudo-gradient, with
// its sign, at the outer rate and scale, with the outer momentum:
// - one worker (asp and ssp(1)): every round's pull finds the round before applied. DiLoCo's
//   settings (momentum inside, Nesterov outside at rate 0.7): the shard's outer optimizer does
//   all the averaging there is.
// - three workers in turns (RoundTurns), asp and ssp(1), the outer SGD at rate 0.7 without
//   momentum (so that the last round's pushes commute but for rounding).
// A shard that counted the pushes but never applied them, or applied them with the wrong sign
// or scale, ends elsewhere (differences of 1e-2 and more: not rounding).
TEST(PeriodicTest, AspAndSspRulesApplyToRounds) {
  const Dataset data = SmallBlobs();
  LocalTrainOptions t = RoundsTrain(4, 40);
  for (ConsistencyMode mode : {ConsistencyMode::kAsp, ConsistencyMode::kSsp}) {
    PsJobOptions ps;
    ps.mode = mode;
    ps.staleness = mode == ConsistencyMode::kSsp ? 1 : 0;
    ps.num_servers = 2;
    ps.num_workers = 3;
    ps.model = SmallMlp();
    ps.train = t;
    // Worker 2 is slow: asp lets the others run rounds ahead; ssp holds them to one round.
    ps.delay_ms = [](int worker, int64_t) { return worker == 2 ? 3.0 : 0.0; };
    PsJobResult r = RunPsJob(ps, data, data);
    ASSERT_TRUE(r.status.ok()) << r.status;
    for (const ServerStats& s : r.server_stats) {
      EXPECT_EQ(s.requests.pushes, 3 * 10);
      int64_t max_staleness = 0;
      for (const auto& [staleness, count] : s.requests.clock_staleness) max_staleness = std::max(max_staleness, staleness);
      if (mode == ConsistencyMode::kSsp) {
        EXPECT_LE(max_staleness, 1);
      }
      EXPECT_LE(max_staleness, 10);  // rounds, not steps
    }
    for (float p : r.params) ASSERT_TRUE(std::isfinite(p));
  }

  LocalTrainOptions diloco = t;
  diloco.optimizer.momentum = 0.9f;
  diloco.periodic.outer_lr = 0.7f;
  diloco.periodic.outer.momentum = 0.9f;
  diloco.periodic.outer.nesterov = true;
  const std::vector<float> one = ReferenceRounds(SmallMlp(), diloco, 1, data);
  for (ConsistencyMode mode : {ConsistencyMode::kAsp, ConsistencyMode::kSsp}) {
    SCOPED_TRACE(std::string("one worker, ") + (mode == ConsistencyMode::kAsp ? "asp" : "ssp(1)"));
    PsJobOptions ps;
    ps.mode = mode;
    ps.staleness = mode == ConsistencyMode::kSsp ? 1 : 0;
    ps.num_servers = 2;
    ps.num_workers = 1;
    ps.model = SmallMlp();
    ps.train = diloco;
    PsJobResult r = RunPsJob(ps, data, data);
    ASSERT_TRUE(r.status.ok()) << r.status;
    for (const ServerStats& s : r.server_stats) EXPECT_EQ(s.requests.pushes, 10);
    const double diff = MaxRelativeDiff(r.params, one, 1e-3);
    std::printf("one worker, %s: against the rounds %.3g\n", mode == ConsistencyMode::kAsp ? "asp" : "ssp(1)", diff);
    EXPECT_LE(diff, 1e-5) << "the shards' parameters are not the rounds' (outer Nesterov at 0.7 on each pseudo-gradient)";
  }

  LocalTrainOptions outer_sgd = t;
  outer_sgd.periodic.outer_lr = 0.7f;
  const std::vector<float> turns = ReferenceTurns(SmallMlp(), outer_sgd, 3, data);
  // Not the rounds' mean: the order matters.
  EXPECT_GT(MaxRelativeDiff(turns, ReferenceRounds(SmallMlp(), outer_sgd, 3, data), 1e-3), 1e-3);
  for (ConsistencyMode mode : {ConsistencyMode::kAsp, ConsistencyMode::kSsp}) {
    const char* name = mode == ConsistencyMode::kAsp ? "asp" : "ssp(1)";
    SCOPED_TRACE(std::string("three workers in turns, ") + name);
    RoundTurns order(3, 4, 40);
    PsJobOptions ps;
    ps.mode = mode;
    ps.staleness = mode == ConsistencyMode::kSsp ? 1 : 0;
    ps.num_servers = 2;
    ps.num_workers = 3;
    ps.model = SmallMlp();
    ps.train = outer_sgd;
    ps.delay_ms = [&order](int worker, int64_t step) {
      order.BeforeCompute(worker, step);
      return 0.0;
    };
    PsJobResult r = RunPsJob(ps, data, data);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_FALSE(order.stuck()) << "a worker waited 30 s for its turn";
    for (const ServerStats& s : r.server_stats) EXPECT_EQ(s.requests.pushes, 3 * 10);
    const double diff = MaxRelativeDiff(r.params, turns, 1e-3);
    std::printf("three workers in turns, %s: against the rounds %.3g\n", name, diff);
    EXPECT_LE(diff, 1e-5)
        << "the shards' parameters are not the rounds' (outer SGD at 0.7 on each pseudo-gradient / 3, in turns)";
  }
}

}  // namespace
}  // namespace gradsync::testing
