#include "models/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/data/sampler.h"
#include "common/data/synthetic.h"
#include "common/optim/optimizer.h"
#include "common/table/row_table.h"

namespace gradsync {
namespace {

std::unique_ptr<Model> Make(const std::string& name, int64_t dim = 20, int classes = 4) {
  ModelOptions o;
  o.name = name;
  o.input_dim = dim;
  o.num_classes = classes;
  o.hidden = {16, 8};
  o.feature_bits = 12;
  auto m = CreateModel(o);
  GRADSYNC_CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

TEST(ModelTest, LayoutIsNamedAndContiguous) {
  auto m = Make("mlp");
  const auto& l = m->layout();
  ASSERT_EQ(l.size(), 6u);
  EXPECT_EQ(l[0].name, "fc1.weight");
  EXPECT_EQ(l[0].shape, (std::vector<int64_t>{20, 16}));
  EXPECT_EQ(l[5].name, "fc3.bias");
  int64_t off = 0;
  for (const auto& t : l) {
    EXPECT_EQ(t.offset, off);
    off += t.size;
  }
  EXPECT_EQ(m->num_params(), off);
  EXPECT_EQ(m->num_params(), 20 * 16 + 16 + 16 * 8 + 8 + 8 * 4 + 4);
  // sparse_logreg: the bias alone is dense; its weights are a table of rows of one float,
  // 2^feature_bits ids, zeros until touched, never allocated whole.
  auto s = Make("sparse_logreg");
  ASSERT_EQ(s->layout().size(), 1u);
  EXPECT_EQ(s->layout()[0].name, "bias");
  EXPECT_EQ(s->num_params(), 1);
  ASSERT_EQ(s->tables().size(), 1u);
  EXPECT_EQ(s->tables()[0].name, "weight");
  EXPECT_EQ(s->tables()[0].dim, 1);
  EXPECT_EQ(s->tables()[0].num_ids, uint64_t{1} << 12);
  EXPECT_EQ(s->tables()[0].init.kind, RowInit::Kind::kZeros);
}

TEST(ModelTest, CreateRejectsBadOptions) {
  ModelOptions o;
  o.name = "resnet";
  EXPECT_EQ(CreateModel(o).status().code(), StatusCode::kInvalidArgument);
  o.name = "mlp";
  o.hidden = {};
  EXPECT_FALSE(CreateModel(o).ok());
  o.hidden = {0};
  EXPECT_FALSE(CreateModel(o).ok());
  o.name = "softmax";
  o.num_classes = 1;
  EXPECT_FALSE(CreateModel(o).ok());
  o.name = "sparse_logreg";
  o.feature_bits = 40;
  EXPECT_FALSE(CreateModel(o).ok());
}

TEST(ModelTest, InitializationIsAPureFunctionOfTheSeed) {
  auto a = Make("mlp"), b = Make("mlp");
  a->Initialize(3);
  b->Initialize(3);
  EXPECT_EQ(0, std::memcmp(a->params().data(), b->params().data(), a->params().size_bytes()));
  b->Initialize(4);
  EXPECT_NE(0, std::memcmp(a->params().data(), b->params().data(), a->params().size_bytes()));
  // nn.Linear's bound: |w| <= 1/sqrt(fan_in).
  for (float w : a->tensor(0)) EXPECT_LE(std::fabs(w), 1.0f / std::sqrt(20.0f));
}

// Trains `steps` SGD+momentum steps on blobs and returns the parameters.
std::vector<float> Train(uint64_t seed, int steps) {
  BlobsOptions bo;
  bo.n = 512;
  bo.dim = 20;
  bo.classes = 4;
  Dataset data = MakeGaussianBlobs(bo);
  auto m = Make("mlp");
  m->Initialize(seed);
  Optimizer opt({0.9f, false, 1e-4f}, m->num_params());
  ShardedSampler sampler(data.n, 1, 0, seed);
  BatchBuffer buf;
  int step = 0;
  for (int epoch = 0; step < steps; ++epoch) {
    auto order = sampler.EpochIndices(epoch);
    for (size_t b = 0; b + 32 <= order.size() && step < steps; b += 32, ++step) {
      m->ForwardBackward(buf.Gather(data, std::span(order).subspan(b, 32)));
      opt.Step(m->params(), m->grads(), 0.05f);
    }
  }
  return std::vector<float>(m->params().begin(), m->params().end());
}

TEST(ModelTest, SameSeedGivesBitIdenticalParametersAfter100Steps) {
  std::vector<float> a = Train(1, 100), b = Train(1, 100), c = Train(2, 100);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
}

TEST(ModelTest, MlpLearnsBlobs) {
  BlobsOptions bo;
  bo.n = 2000;
  bo.dim = 20;
  bo.classes = 4;
  bo.center_scale = 0.7f;
  Dataset data = MakeGaussianBlobs(bo);
  auto m = Make("mlp");
  m->Initialize(0);
  const double before = Evaluate(*m, data).accuracy;
  Optimizer opt({0.9f, false, 0.0f}, m->num_params());
  float first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    int64_t begin = (step * 50) % data.n;
    float loss = m->ForwardBackward(SliceBatch(data, begin, begin + 50));
    if (step == 0) first = loss;
    last = loss;
    opt.Step(m->params(), m->grads(), 0.05f);
  }
  EvalResult after = Evaluate(*m, data, 300);
  EXPECT_LT(last, first * 0.5f);
  EXPECT_GT(after.accuracy, 0.9);
  EXPECT_GT(after.accuracy, before + 0.3);
}

TEST(ModelTest, SparseLogRegLearnsAndTouchesOnlyBatchKeys) {
  SparseLogisticOptions so;
  so.n = 20000;
  so.feature_bits = 20;
  so.nnz = 20;
  Dataset data = MakeSparseLogistic(so);
  ModelOptions mo;
  mo.name = "sparse_logreg";
  mo.feature_bits = 20;
  auto m = CreateModel(mo);
  ASSERT_TRUE(m.ok());
  (*m)->Initialize(0);
  // The weights' table as a local sync keeps it: rows made by their first gradient.
  RowTable weights((*m)->tables()[0], 0, 1);
  BatchBuffer buf;
  std::vector<uint32_t> idx(100);
  std::vector<std::vector<uint64_t>> ids;
  auto read_rows = [&](const Batch& b) {
    ASSERT_TRUE((*m)->TableIds(b, &ids).ok());
    weights.Read(ids[0], (*m)->table_rows().data());
  };
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int64_t begin = 0; begin + 100 <= 16000; begin += 100) {
      for (int i = 0; i < 100; ++i) idx[i] = static_cast<uint32_t>(begin + i);
      Batch b = buf.Gather(data, idx);
      read_rows(b);
      (*m)->ForwardBackward(b);
      // The batch's keys, sorted and unique, are its rows; each has the gradient of its key.
      ASSERT_EQ((*m)->table_grads().size(), ids[0].size());
      EXPECT_TRUE(std::is_sorted(ids[0].begin(), ids[0].end()));
      EXPECT_LE(ids[0].size(), 100u * 20u);
      const int64_t held = weights.rows();
      ASSERT_TRUE(weights.Apply(ids[0], (*m)->table_grads().data(), 8.0f, 1.0f, 1.0f).ok());
      // Only the batch's keys exist in the table: at most its rows more than before.
      EXPECT_LE(weights.rows(), held + static_cast<int64_t>(ids[0].size()));
      (*m)->params()[0] -= 8.0f * (*m)->grads()[0];
    }
  }
  EXPECT_LT(weights.rows(), int64_t{1} << 20);  // never the whole id space
  // Held-out rows carry many keys never seen in training (the power-law tail), so the
  // attainable accuracy is well below 1; chance is 0.5.
  Batch held_out = SliceBatch(data, 16000, 20000);
  read_rows(held_out);
  EvalStats s = (*m)->EvaluateBatch(held_out);
  EXPECT_GT(static_cast<double>(s.correct) / s.count, 0.65);
  Batch train = SliceBatch(data, 0, 16000);
  read_rows(train);
  EvalStats t = (*m)->EvaluateBatch(train);
  EXPECT_GT(static_cast<double>(t.correct) / t.count, 0.72);
  // A key outside 2^feature_bits is one error naming the table.
  Batch bad = SliceBatch(data, 0, 1);
  std::vector<uint64_t> keys(bad.keys.begin(), bad.keys.end());
  keys[0] = uint64_t{1} << 20;
  bad.keys = keys;
  const Status refused = (*m)->TableIds(bad, &ids);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("table 'weight'"), std::string::npos) << refused;
}

TEST(ModelTest, EvaluateCountsEveryExample) {
  BlobsOptions bo;
  bo.n = 1234;
  bo.dim = 20;
  bo.classes = 4;
  Dataset data = MakeGaussianBlobs(bo);
  auto m = Make("softmax");
  m->Initialize(0);
  EvalResult a = Evaluate(*m, data, 100), b = Evaluate(*m, data, 1234);
  EXPECT_NEAR(a.loss, b.loss, 1e-9);
  EXPECT_DOUBLE_EQ(a.accuracy, b.accuracy);
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

Dataset PrecisionBlobs() {
  BlobsOptions bo;
  bo.n = 2000;
  bo.dim = 20;
  bo.classes = 4;
  bo.center_scale = 0.7f;
  return MakeGaussianBlobs(bo);
}

std::unique_ptr<Model> MakeMlp(Precision p) {
  ModelOptions o;
  o.name = "mlp";
  o.input_dim = 20;
  o.num_classes = 4;
  o.hidden = {32, 16};
  o.precision = p;
  auto m = CreateModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

double RelativeL2(ConstFloatSpan a, ConstFloatSpan b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(ModelPrecisionTest, SixteenBitGradientsTrackFp32AndAre16BitValues) {
  const Dataset data = PrecisionBlobs();
  const Batch batch = SliceBatch(data, 0, 64);
  auto ref = MakeMlp(Precision::kFp32);
  ref->Initialize(3);
  const float ref_loss = ref->ForwardBackward(batch);
  for (auto [p, tolerance] : {std::pair{Precision::kBf16, 0.06}, std::pair{Precision::kFp16, 0.004}}) {
    auto m = MakeMlp(p);
    EXPECT_EQ(m->precision(), p);
    m->Initialize(3);
    const float loss = m->ForwardBackward(batch);
    EXPECT_NEAR(loss, ref_loss, 0.02 * ref_loss) << PrecisionName(p);
    EXPECT_LT(RelativeL2(m->grads(), ref->grads()), tolerance) << PrecisionName(p);
    EXPECT_GT(RelativeL2(m->grads(), ref->grads()), 0.0) << PrecisionName(p) << ": no rounding happened";
    // Each gradient is what a 16-bit store holds.
    std::vector<float> g(m->grads().begin(), m->grads().end());
    RoundTo16(*PrecisionFormat(p), g.data(), g.size());
    EXPECT_EQ(0, std::memcmp(g.data(), m->grads().data(), g.size() * sizeof(float))) << PrecisionName(p);
    // The master weights stay fp32: the model computed on rounded copies.
    EXPECT_EQ(0, std::memcmp(m->params().data(), ref->params().data(), g.size() * sizeof(float)));
  }
}

TEST(ModelPrecisionTest, TheLossScaleScalesTheGradientAndFp16Overflows) {
  const Dataset data = PrecisionBlobs();
  const Batch batch = SliceBatch(data, 0, 64);
  auto m = MakeMlp(Precision::kFp16);
  m->Initialize(3);
  const float loss1 = m->ForwardBackward(batch);
  std::vector<float> unscaled(m->grads().begin(), m->grads().end());
  m->set_loss_scale(1024.0f);
  const float loss2 = m->ForwardBackward(batch);
  EXPECT_EQ(loss1, loss2);  // the loss reported is the mean loss's, unscaled
  std::vector<float> scaled(m->grads().begin(), m->grads().end());
  Scale(scaled, 1.0f / 1024);
  EXPECT_LT(RelativeL2(scaled, unscaled), 2e-3);  // a power of two: only the 16-bit roundings differ
  EXPECT_TRUE(AllFinite(m->grads()));
  m->set_loss_scale(1e9f);
  m->ForwardBackward(batch);
  EXPECT_FALSE(AllFinite(m->grads()));  // beyond half's 65504
  auto b = MakeMlp(Precision::kBf16);
  b->Initialize(3);
  b->set_loss_scale(1e9f);
  b->ForwardBackward(batch);
  EXPECT_TRUE(AllFinite(b->grads()));  // bf16 has float's range
}

TEST(ModelPrecisionTest, MlpLearnsBlobsIn16Bits) {
  const Dataset data = PrecisionBlobs();
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    auto m = MakeMlp(p);
    m->Initialize(0);
    Optimizer opt({0.9f, false, 0.0f}, m->num_params());
    for (int step = 0; step < 300; ++step) {
      const int64_t begin = (step * 50) % data.n;
      m->ForwardBackward(SliceBatch(data, begin, begin + 50));
      opt.Step(m->params(), m->grads(), 0.05f);
    }
    EXPECT_GT(Evaluate(*m, data, 300).accuracy, 0.9) << PrecisionName(p);
  }
}

TEST(ModelPrecisionTest, SparseLogRegIsFp32Only) {
  ModelOptions o;
  o.name = "sparse_logreg";
  o.precision = Precision::kBf16;
  auto m = CreateModel(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("fp32 only"), std::string::npos);
}

}  // namespace
}  // namespace gradsync
