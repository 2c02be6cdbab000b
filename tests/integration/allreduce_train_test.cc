// Training in allreduce mode (threads over 127.0.0.1): the same SGD as local training with the
// global batch and as bsp over the parameter server.
#include <gtest/gtest.h>

#include <thread>

#include "common/synthetic.h"
#include "tests/support/ps_job.h"

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
  BlobsOptions bo;
  bo.n = 1600;
  bo.dim = 12;
  bo.classes = 4;
  bo.center_scale = 0.8f;
  Dataset data = MakeGaussianBlobs(bo);
  ModelOptions mo;
  mo.name = model_name;
  mo.input_dim = 12;
  mo.num_classes = 4;
  mo.hidden = {16};
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
