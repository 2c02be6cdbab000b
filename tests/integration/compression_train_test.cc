// Every codec trains on both paths: pushes over the parameter server (bsp) and all-gathered
// payloads in allreduce mode.
#include <gtest/gtest.h>

#include "common/data/synthetic.h"
#include "tests/support/ps_job.h"

namespace gradsync::testing {
namespace {

struct Case {
  std::string spec;
  bool error_feedback;
};

class CompressionTrainTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    BlobsOptions bo;
    bo.n = 1200;
    bo.dim = 12;
    bo.classes = 3;
    bo.center_scale = 0.8f;
    data_ = MakeGaussianBlobs(bo);
    model_.name = "mlp";
    model_.input_dim = 12;
    model_.num_classes = 3;
    model_.hidden = {16};
    train_.batch = 16;
    train_.epochs = 100;
    train_.max_steps = 120;
    train_.lr = {LrSchedule::Kind::kConstant, 0.05f, 0, 0.0f};
    train_.optimizer.momentum = 0.9f;
  }
  double Accuracy(const std::vector<float>& params) {
    auto m = std::move(CreateModel(model_)).value();
    std::copy(params.begin(), params.end(), m->params().begin());
    return Evaluate(*m, data_).accuracy;
  }
  // 2 servers, 2 workers, bsp, with `train` and `compression` (GetParam()'s when empty).
  PsJobOptions JobOptions(const LocalTrainOptions& train, const std::string& compression = "") {
    PsJobOptions o;
    o.mode = ConsistencyMode::kBsp;
    o.num_servers = 2;
    o.num_workers = 2;
    o.model = model_;
    o.train = train;
    o.compression = compression.empty() ? GetParam().spec : compression;
    o.error_feedback = compression.empty() && GetParam().error_feedback;
    return o;
  }
  Dataset data_;
  ModelOptions model_;
  LocalTrainOptions train_;
};

TEST_P(CompressionTrainTest, TrainsOverTheParameterServer) {
  PsJobOptions o = JobOptions(train_);
  PsJobResult r = RunPsJob(o, data_, data_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (const auto& st : r.server_stats) EXPECT_EQ(st.requests.rejected, 0);
  EXPECT_GT(Accuracy(r.params), 0.85) << GetParam().spec;
}

TEST_P(CompressionTrainTest, TrainsOverTheParameterServerWithCompressedPulls) {
  PsJobOptions o = JobOptions(train_);
  o.compress_pull = true;
  PsJobResult r = RunPsJob(o, data_, data_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  int64_t compressed = 0;
  for (const auto& st : r.server_stats) {
    EXPECT_EQ(st.requests.rejected, 0);
    compressed += st.channels.compressed_pulls;
  }
  // Every pull but each worker's first (and rank 0's evaluation pulls) is a delta.
  EXPECT_GE(compressed, 2 * 2 * (train_.max_steps - 2));
  EXPECT_GT(Accuracy(r.params), 0.85) << GetParam().spec;
}

TEST_P(CompressionTrainTest, TrainsInAllreduceMode) {
  auto r = RunAllreduceJob(3, model_, train_, data_, 100 * sizeof(float), GetParam().spec, GetParam().error_feedback);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(Accuracy(*r), 0.85) << GetParam().spec;
}

TEST_F(CompressionTrainTest, MomentumCorrectionTrainsOnBothPaths) {
  // DGC: momentum 0.9 moves to the workers; the applied update is plain SGD.
  LocalTrainOptions t = train_;
  t.optimizer.momentum = 0.0f;
  PsJobOptions o = JobOptions(t, "topk:0.05");
  o.correction_momentum = 0.9f;
  PsJobResult r = RunPsJob(o, data_, data_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_GT(Accuracy(r.params), 0.85);
  auto ar = RunAllreduceJob(3, model_, t, data_, 100 * sizeof(float), "topk:0.05", false, 0.9f);
  ASSERT_TRUE(ar.ok()) << ar.status();
  EXPECT_GT(Accuracy(*ar), 0.85);
}

INSTANTIATE_TEST_SUITE_P(Codecs, CompressionTrainTest,
                         ::testing::Values(Case{"fp16", false}, Case{"int8", false}, Case{"qsgd:16", false},
                                           Case{"sign", true}, Case{"topk:0.05", true}, Case{"topk:0.05", false},
                                           Case{"randomk:0.25", true}),
                         [](const auto& p) {
                           std::string s = p.param.spec + (p.param.error_feedback ? "_ef" : "");
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace gradsync::testing
