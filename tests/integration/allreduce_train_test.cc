// Training in allreduce mode (threads over 127.0.0.1): the same SGD as local training with the
// global batch and as bsp over the parameter server.
#include <gtest/gtest.h>

#include <thread>

#include "allreduce/tcp_ring.h"
#include "common/synthetic.h"
#include "tests/support/ps_job.h"
#include "tests/support/temp_dir.h"
#include "worker/allreduce_trainer.h"

namespace gradsync::testing {
namespace {

// Float summation order differs (one sgemm over 32 rows locally, a ring sum of four 8-row
// gradients here, a rank-order sum on the PS), so the trajectories agree to rounding, not to the
// bit: after 200 steps at the worker's default rate the MLP is within 6e-6 of local SGD and 5e-6
// of bsp on this machine (at rate 0.05, ReLU kinks let the same last-bit differences grow to
// about 2e-5), softmax regression within 1e-6.
class AllreduceEquivalenceTest : public ::testing::TestWithParam<std::pair<std::string, double>> {};

TEST_P(AllreduceEquivalenceTest, FourWorkersEqualLocalSgdAndBspWithTheGlobalBatch) {
  const auto [model_name, tolerance] = GetParam();
  Dataset data = SmallBlobs();
  ModelOptions mo = SmallMlp();
  mo.name = model_name;
  LocalTrainOptions t;
  t.batch = 8;
  t.epochs = 100;
  t.max_steps = 200;
  t.seed = 5;
  t.lr = {LrSchedule::Kind::kCosine, 0.02f, 200, 0.0f};  // the worker's default rate
  t.optimizer.momentum = 0.9f;
  t.optimizer.weight_decay = 1e-4f;
  // A 100-float bucket cuts the gradients into several all-reduces.
  auto ar = RunAllreduceJob(4, mo, t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  LocalTrainOptions local = t;
  local.batch = 32;
  std::vector<float> expect = RunLocal(mo, local, 0, data);
  const double vs_local = MaxRelativeDiff(*ar, expect, 1e-3);
  RecordProperty("max_relative_diff_vs_local", std::to_string(vs_local));
  EXPECT_LE(vs_local, tolerance);

  PsJobOptions ps;
  ps.mode = ConsistencyMode::kBsp;
  ps.num_servers = 2;
  ps.num_workers = 4;
  ps.model = mo;
  ps.train = t;
  PsJobResult bsp = RunPsJob(ps, data, data);
  ASSERT_TRUE(bsp.status.ok()) << bsp.status;
  const double vs_bsp = MaxRelativeDiff(*ar, bsp.params, 1e-3);
  RecordProperty("max_relative_diff_vs_bsp", std::to_string(vs_bsp));
  EXPECT_LE(vs_bsp, tolerance);
}

INSTANTIATE_TEST_SUITE_P(Models, AllreduceEquivalenceTest,
                         ::testing::Values(std::make_pair(std::string("softmax"), 1e-5),
                                           std::make_pair(std::string("mlp"), 1e-5)),
                         [](const auto& p) { return p.param.first; });

LocalTrainOptions AdamTrain(int64_t batch, int64_t steps) {
  LocalTrainOptions t = SmallTrain(batch, steps, 0.0f);
  t.lr = {LrSchedule::Kind::kConstant, 0.005f, 0, 0.0f};
  t.optimizer.kind = OptimizerKind::kAdam;
  return t;
}

// Every rank applies Adam to the averaged gradient: local Adam with the global batch.
TEST(AllreduceTrainTest, AdamEqualsLocalAdamWithTheGlobalBatch) {
  Dataset data = SmallBlobs();
  LocalTrainOptions t = AdamTrain(8, 100);
  auto ar = RunAllreduceJob(4, SmallMlp(), t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  LocalTrainOptions local = t;
  local.batch = 32;
  const double diff = MaxRelativeDiff(*ar, RunLocal(SmallMlp(), local, 0, data), 1e-3);
  RecordProperty("max_relative_diff_vs_local", std::to_string(diff));
  EXPECT_LE(diff, 1e-4);
}

// One rank's all-reduce job with Adam and checkpoints every 10 steps; its parameters.
Result<std::vector<float>> RunCheckpointed(const Dataset& data, LocalTrainOptions t, const std::string& dir,
                                           bool resume) {
  ASSIGN_OR_RETURN(auto ring, RingCollective::Listen("127.0.0.1", {}));
  RETURN_IF_ERROR(ring->Connect(0, {"127.0.0.1:" + std::to_string(ring->port())}, 10));
  auto model = MakeTestModel(SmallMlp(), false);
  model->Initialize(0);
  AllreduceTrainOptions o;
  o.train = t;
  o.evaluate = false;
  o.checkpoint_dir = dir;
  o.checkpoint_every = 10;
  o.resume = resume;
  AllreduceTrainer trainer(o, model.get(), &data, &data, nullptr, ring.get());
  RETURN_IF_ERROR(trainer.Run().status());
  return std::vector<float>(model->params().begin(), model->params().end());
}

// A resumed run goes on from the checkpoint's m, v and step (Adam's t) bit for bit; a checkpoint
// another optimizer wrote is refused.
TEST(AllreduceTrainTest, AdamResumesFromItsCheckpointBitForBit) {
  Dataset data = SmallBlobs();
  TempDir dir;
  auto straight = RunCheckpointed(data, AdamTrain(16, 40), dir.path(), false);
  ASSERT_TRUE(straight.ok()) << straight.status();
  ASSERT_TRUE(RunCheckpointed(data, AdamTrain(16, 20), dir.path(), false).ok());  // checkpoint at 20
  auto resumed = RunCheckpointed(data, AdamTrain(16, 40), dir.path(), true);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, *straight);

  LocalTrainOptions sgd = AdamTrain(16, 10);
  sgd.optimizer = OptimizerOptions{};
  ASSERT_TRUE(RunCheckpointed(data, sgd, dir.path(), false).ok());
  auto refused = RunCheckpointed(data, AdamTrain(16, 20), dir.path(), true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("was written with --optimizer=sgd; this run uses --optimizer=adam"),
            std::string::npos)
      << refused.status();
}

TEST(AllreduceTrainTest, SparseModelAllGathersItsGradients) {
  SparseLogisticOptions so;
  so.n = 3000;
  so.feature_bits = 14;
  so.nnz = 8;
  Dataset data = MakeSparseLogistic(so);
  ModelOptions mo;
  mo.name = "sparse_logreg";
  mo.feature_bits = 14;
  LocalTrainOptions t;
  t.batch = 25;
  t.epochs = 100;
  t.max_steps = 100;
  t.lr = {LrSchedule::Kind::kConstant, 4.0f, 0, 0.0f};
  auto ar = RunAllreduceJob(3, mo, t, data, 1 << 20);
  ASSERT_TRUE(ar.ok()) << ar.status();
  LocalTrainOptions local = t;
  local.batch = 75;
  std::vector<float> expect = RunLocal(mo, local, 0, data);
  EXPECT_LE(MaxRelativeDiff(*ar, expect, 1e-3), 1e-5);
}

}  // namespace
}  // namespace gradsync::testing
