// The DLRM-style model whose tables live outside it (models/dlrm.h). The mutation each test
// catches:
//   DlrmGradientTest.MatchesFloat64FiniteDifferences    a wrong term anywhere in backward: an
//       interaction pair's gradient given to one side only, the z part of the top input not fed
//       back, a ReLU mask dropped or put on the bottom's linear last layer, a bias gradient not
//       summed over the batch, a shared id's row gradient overwritten instead of summed (= for
//       +=), rows filled from the wrong table or id, the top input's dots in another order than
//       the weights see them
//   DlrmTest.TableIdsNamesEachTablesSortedUniqueIds     ids not sorted or not unique, a table's ids
//       read from another feature, rows not sized to them, the CSR's absolute offsets ignored
//   DlrmTest.TableIdsRefusesIdsPastAFixedTable          an id >= ids_per_table accepted, the
//       refusal not naming the table and the feature, rows left sized after a refusal, a batch
//       without exactly one key per table accepted; any-id tables refusing large ids
//   DlrmTest.RowsNoLossDependsOnGetZeroGradients        table gradients accumulated across calls
//       (not cleared), garbage in rows whose gradient is zero
//   DlrmTest.LossScaleScalesEveryGradientButNotTheLoss  the loss scale left out of the table
//       rows' gradients (or put into the loss)
//   DlrmTest.AStepOnABatchTableIdsDidNotNameStops       ForwardBackward reading rows by a stale
//       TableIds (another batch's ids) without noticing
//   DlrmTest.GradReadyLastLayerFirstAndParamWaitInOrder a tensor reported twice or never, the
//       bottom reported before the top, parameters waited for out of order
//   DlrmTest.LayoutTablesAndOptions                     tensor names or shapes off (the top's
//       input not dim + F(F+1)/2), tables misnamed or with another dim, id space or init, a bad
//       size let through CreateModel, bf16 accepted
//   DlrmTest.SameSeedSameBits                           initialization or a training step
//       depending on anything but the seed (an unseeded stream, table seeds not derived from the
//       model's seed, a step's result depending on leftover buffers)
//   DlrmTest.PredictAndEvaluateAgree                    Predict's probabilities not the
//       sigmoid of the loss's logits, correct not (p > 0.5) == label, sparse_logreg's Predict
//       off, the default Predict not kUnimplemented
//   DlrmTest.ClickBatchViewSharesTheIds                 the view copying the ids or offsets off
//   DlrmTrainTest.LearnsTheClickLogNearTheOraclesAuc    anything that stops learning: wrong
//       gradient signs, rows never applied, the interaction dropped
#include "models/dlrm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <set>

#include "common/base/numeric/rng.h"
#include "common/data/binary_metrics.h"
#include "common/data/click/click_log.h"
#include "common/table/row_table.h"
#include "models/sparse_logreg.h"

namespace gradsync {
namespace {

// A CSR batch built by hand: ids[i][f] for example i, feature f.
struct HandBatch {
  std::vector<float> dense;
  std::vector<int64_t> row_ptr;
  std::vector<uint64_t> keys;
  std::vector<int32_t> labels;
  int64_t size = 0;
  int num_dense = 0;

  Batch View() const {
    Batch b;
    b.size = size;
    b.dim = num_dense;
    b.x = dense.data();
    b.row_ptr = row_ptr;
    b.keys = keys;
    b.labels = labels;
    return b;
  }
};

HandBatch RandomBatch(int64_t size, int num_dense, int num_tables, uint64_t ids, uint64_t seed) {
  Rng rng(seed);
  HandBatch h;
  h.size = size;
  h.num_dense = num_dense;
  for (int64_t i = 0; i < size * num_dense; ++i)
    h.dense.push_back(static_cast<float>(rng.Normal()));
  for (int64_t i = 0; i <= size; ++i) h.row_ptr.push_back(i * num_tables);
  for (int64_t i = 0; i < size * num_tables; ++i) h.keys.push_back(rng.UniformInt(ids));
  for (int64_t i = 0; i < size; ++i) h.labels.push_back(static_cast<int32_t>(rng.UniformInt(2)));
  return h;
}

std::unique_ptr<Model> MakeDlrm(const DlrmOptions& o) {
  ModelOptions mo;
  mo.name = "dlrm";
  mo.dlrm = o;
  auto m = CreateModel(mo);
  GRADSYNC_CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

// The model's loss written out in double, from the dense parameters p (bottom then top, each
// layer's weight [in, out] then bias) and the step's rows (table after table, each table's ids in
// the order `ids` lists them).
double DlrmLossRef(const std::vector<double>& p, const std::vector<double>& rows,
                   const DlrmOptions& o, const std::vector<std::vector<uint64_t>>& ids,
                   const Batch& b) {
  const int64_t d = o.dim, f_count = o.num_tables;
  std::vector<int64_t> bottom{o.num_dense}, top{d + f_count * (f_count + 1) / 2};
  bottom.insert(bottom.end(), o.bottom.begin(), o.bottom.end());
  bottom.push_back(d);
  top.insert(top.end(), o.top.begin(), o.top.end());
  top.push_back(1);
  std::vector<size_t> table_row0(static_cast<size_t>(f_count), 0);
  for (size_t f = 1; f < table_row0.size(); ++f)
    table_row0[f] = table_row0[f - 1] + ids[f - 1].size();
  auto mlp = [&](std::vector<double> a, const std::vector<int64_t>& dims, size_t* off) {
    for (size_t l = 0; l + 1 < dims.size(); ++l) {
      const int64_t din = dims[l], dout = dims[l + 1];
      std::vector<double> z(static_cast<size_t>(dout));
      for (int64_t o2 = 0; o2 < dout; ++o2) {
        double s = p[*off + din * dout + o2];
        for (int64_t k = 0; k < din; ++k) s += a[k] * p[*off + k * dout + o2];
        z[o2] = (l + 2 < dims.size()) ? std::max(0.0, s) : s;
      }
      *off += din * dout + dout;
      a = z;
    }
    return a;
  };
  double total = 0.0;
  for (int64_t i = 0; i < b.size; ++i) {
    size_t off = 0;
    std::vector<double> z =
        mlp(std::vector<double>(b.x + i * o.num_dense, b.x + (i + 1) * o.num_dense), bottom, &off);
    std::vector<std::vector<double>> u{z};
    for (int64_t f = 0; f < f_count; ++f) {
      const uint64_t id = b.keys[b.row_ptr[i] + f];
      const auto& t = ids[f];
      const size_t r = table_row0[f] + (std::lower_bound(t.begin(), t.end(), id) - t.begin());
      u.emplace_back(rows.begin() + r * d, rows.begin() + (r + 1) * d);
    }
    std::vector<double> in = z;
    for (size_t a = 1; a < u.size(); ++a) {
      for (size_t c = 0; c < a; ++c) {
        double s = 0.0;
        for (int64_t k = 0; k < d; ++k) s += u[a][k] * u[c][k];
        in.push_back(s);
      }
    }
    const double logit = mlp(in, top, &off)[0];
    const double y = b.labels[i];
    total += std::max(logit, 0.0) - y * logit + std::log1p(std::exp(-std::fabs(logit)));
  }
  return total / b.size;
}

template <typename F>
double NumericGrad(std::vector<double>& p, size_t i, F&& loss) {
  const double h = 1e-6 * std::max(1.0, std::fabs(p[i]));
  const double keep = p[i];
  p[i] = keep + h;
  const double up = loss();
  p[i] = keep - h;
  const double down = loss();
  p[i] = keep;
  return (up - down) / (2 * h);
}

struct GradCase {
  std::string name;
  std::vector<int64_t> bottom, top;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class DlrmGradientTest : public ::testing::TestWithParam<GradCase> {};

TEST_P(DlrmGradientTest, MatchesFloat64FiniteDifferences) {
  DlrmOptions o;
  o.num_dense = 3;
  o.num_tables = 3;
  o.dim = 4;
  o.ids_per_table = 4;
  o.bottom = GetParam().bottom;
  o.top = GetParam().top;
  auto model = MakeDlrm(o);
  model->Initialize(5);
  // Larger weights than the default init, so that ReLUs are both on and off and every term counts.
  for (float& w : model->params()) w *= 2.0f;
  // 7 examples over 4 ids a table: ids shared between examples in every table.
  HandBatch h = RandomBatch(7, o.num_dense, o.num_tables, o.ids_per_table, 21);
  const Batch batch = h.View();
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(batch, &ids).ok());
  size_t total_rows = 0;
  for (const auto& t : ids) total_rows += t.size();
  ASSERT_LT(total_rows, static_cast<size_t>(batch.size * o.num_tables)) << "no id is shared";
  Rng rng(8);
  for (float& r : model->table_rows()) r = static_cast<float>(0.7 * rng.Normal());
  const float loss = model->ForwardBackward(batch);

  std::vector<double> p(model->params().begin(), model->params().end());
  std::vector<double> rows(model->table_rows().begin(), model->table_rows().end());
  auto ref = [&] { return DlrmLossRef(p, rows, o, ids, batch); };
  EXPECT_NEAR(loss, ref(), 1e-5 * std::fabs(ref()));
  double worst_abs = 0.0, worst_rel = 0.0;
  auto expect_close = [&](double analytic, double numeric, const std::string& where) {
    // Float gradients carry ~1e-6 relative rounding; a real mistake shows up as O(1) relative
    // error.
    EXPECT_NEAR(analytic, numeric, 1e-3 * std::fabs(numeric) + 2e-6) << where;
    worst_abs = std::max(worst_abs, std::fabs(analytic - numeric));
    worst_rel =
        std::max(worst_rel, std::fabs(analytic - numeric) / std::max(std::fabs(numeric), 1e-3));
  };
  const auto grads = model->grads();
  for (size_t t = 0; t < model->layout().size(); ++t) {
    const TensorInfo& info = model->layout()[t];
    for (int64_t k = 0; k < info.size; ++k) {
      const auto i = static_cast<size_t>(info.offset + k);
      expect_close(grads[i], NumericGrad(p, i, ref), info.name + "[" + std::to_string(k) + "]");
    }
  }
  const auto table_grads = model->table_grads();
  ASSERT_EQ(table_grads.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    expect_close(table_grads[i], NumericGrad(rows, i, ref), "row float " + std::to_string(i));
  }
  std::printf(
      "dlrm gradient check (%s): %zu dense + %zu row floats, max |analytic - numeric| %.3g, max "
      "relative %.3g\n",
      GetParam().name.c_str(), p.size(), rows.size(), worst_abs, worst_rel);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DlrmGradientTest,
                         ::testing::Values(GradCase{"one_hidden_each", {5}, {6}},
                                           GradCase{"linear_mlps", {}, {}},
                                           GradCase{"two_hidden_each", {5, 4}, {6, 3}}),
                         [](const auto& p) { return p.param.name; });

TEST(DlrmTest, TableIdsNamesEachTablesSortedUniqueIds) {
  DlrmOptions o;
  o.num_dense = 2;
  o.num_tables = 2;
  o.dim = 3;
  o.ids_per_table = 100;
  auto model = MakeDlrm(o);
  // Keys at absolute offsets (a slice of a larger CSR): example i's keys at row_ptr[i].
  HandBatch h;
  h.size = 3;
  h.num_dense = 2;
  h.dense.assign(6, 0.5f);
  h.keys = {999, 999, 7, 40, 7, 3, 50, 3};  // two leading keys outside the batch
  h.row_ptr = {2, 4, 6, 8};
  h.labels = {0, 1, 0};
  std::vector<std::vector<uint64_t>> ids{{1, 2, 3}, {4}, {5}};  // stale contents are replaced
  ASSERT_TRUE(model->TableIds(h.View(), &ids).ok());
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], (std::vector<uint64_t>{7, 50}));
  EXPECT_EQ(ids[1], (std::vector<uint64_t>{3, 40}));
  EXPECT_EQ(model->table_rows().size(), 4u * 3u);
  EXPECT_EQ(model->table_grads().size(), 4u * 3u);
  model->Initialize(1);
  EXPECT_GT(model->ForwardBackward(h.View()), 0.0f);
}

TEST(DlrmTest, TableIdsRefusesIdsPastAFixedTable) {
  DlrmOptions o;
  o.num_dense = 2;
  o.num_tables = 4;
  o.dim = 2;
  o.ids_per_table = 100;
  auto model = MakeDlrm(o);
  HandBatch h = RandomBatch(5, 2, 4, 100, 3);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(h.View(), &ids).ok());
  ASSERT_GT(model->table_rows().size(), 0u);

  h.keys[2 * 4 + 3] = 123;  // example 2, feature 3
  Status st = model->TableIds(h.View(), &ids);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("table 'table.3' (feature 3): id 123 is outside [0, 100)"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("example 2"), std::string::npos) << st;
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st;
  EXPECT_EQ(model->table_rows().size(), 0u);
  ASSERT_EQ(ids.size(), 4u);
  for (const auto& t : ids) EXPECT_TRUE(t.empty());

  h.keys[2 * 4 + 3] = 100;  // the first id past the end
  EXPECT_EQ(model->TableIds(h.View(), &ids).code(), StatusCode::kInvalidArgument);
  h.keys[2 * 4 + 3] = static_cast<uint64_t>(int64_t{-1});
  st = model->TableIds(h.View(), &ids);
  EXPECT_NE(st.message().find("table 'table.3' (feature 3): id -1 is negative"), std::string::npos)
      << st;
  h.keys[2 * 4 + 3] = 99;
  EXPECT_TRUE(model->TableIds(h.View(), &ids).ok());

  // Not one key per table.
  HandBatch bad = h;
  bad.row_ptr[3] -= 1;
  st = model->TableIds(bad.View(), &ids);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("example 2"), std::string::npos) << st;
  bad = h;
  bad.row_ptr.pop_back();
  EXPECT_EQ(model->TableIds(bad.View(), &ids).code(), StatusCode::kInvalidArgument);

  // A table of any 64-bit id takes every id.
  o.ids_per_table = 0;
  auto any = MakeDlrm(o);
  h.keys[0] = ~uint64_t{0};
  ASSERT_TRUE(any->TableIds(h.View(), &ids).ok());
  EXPECT_EQ(ids[0].back(), ~uint64_t{0});
}

TEST(DlrmTest, RowsNoLossDependsOnGetZeroGradients) {
  DlrmOptions o;
  o.num_dense = 3;
  o.num_tables = 3;
  o.dim = 4;
  o.ids_per_table = 10;
  o.bottom = {};
  o.top = {};  // one linear layer each: top.fc1.weight's rows [dim, dim + pairs) are the dots'
  auto model = MakeDlrm(o);
  model->Initialize(2);
  HandBatch h = RandomBatch(6, 3, 3, 10, 4);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(h.View(), &ids).ok());
  Rng rng(1);
  for (float& r : model->table_rows()) r = static_cast<float>(rng.Normal());
  model->ForwardBackward(h.View());
  const std::vector<float> first(model->table_grads().begin(), model->table_grads().end());
  EXPECT_GT(SquaredNorm(model->table_grads()), 0.0);
  // The same step again: the same gradient, not twice it.
  model->ForwardBackward(h.View());
  EXPECT_TRUE(std::equal(first.begin(), first.end(), model->table_grads().begin()));

  // The dots' weights zeroed: no loss depends on any row, so every row's gradient is exactly 0.
  const TensorInfo& w = model->layout()[2];
  ASSERT_EQ(w.name, "top.fc1.weight");
  ASSERT_EQ(w.shape, (std::vector<int64_t>{4 + 6, 1}));
  for (int64_t k = 4; k < 10; ++k) model->tensor(2)[static_cast<size_t>(k)] = 0.0f;
  model->ForwardBackward(h.View());
  for (float g : model->table_grads()) ASSERT_EQ(g, 0.0f);
  EXPECT_GT(SquaredNorm(model->grad(0)), 0.0);  // the dense part still learns
}

TEST(DlrmTest, LossScaleScalesEveryGradientButNotTheLoss) {
  DlrmOptions o;
  o.num_dense = 3;
  o.num_tables = 2;
  o.dim = 4;
  o.ids_per_table = 10;
  auto model = MakeDlrm(o);
  model->Initialize(3);
  HandBatch h = RandomBatch(6, 3, 2, 10, 5);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(h.View(), &ids).ok());
  Rng rng(4);
  for (float& r : model->table_rows()) r = static_cast<float>(rng.Normal());
  const float loss = model->ForwardBackward(h.View());
  const std::vector<float> grads(model->grads().begin(), model->grads().end());
  const std::vector<float> rows(model->table_grads().begin(), model->table_grads().end());
  model->set_loss_scale(8.0f);  // a power of two: every gradient exactly 8 times
  EXPECT_EQ(model->ForwardBackward(h.View()), loss);
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(model->grads()[i], 8.0f * grads[i]) << i;
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(model->table_grads()[i], 8.0f * rows[i]) << i;
}

TEST(DlrmTest, AStepOnABatchTableIdsDidNotNameStops) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS has started threads
  DlrmOptions o;
  o.num_dense = 2;
  o.num_tables = 2;
  o.dim = 2;
  o.ids_per_table = 1000;
  auto model = MakeDlrm(o);
  model->Initialize(0);
  HandBatch a = RandomBatch(4, 2, 2, 1000, 1), b = RandomBatch(4, 2, 2, 1000, 2);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(a.View(), &ids).ok());
  EXPECT_DEATH(model->ForwardBackward(b.View()), "which TableIds did not name");
}

TEST(DlrmTest, GradReadyLastLayerFirstAndParamWaitInOrder) {
  DlrmOptions o;
  o.num_dense = 3;
  o.num_tables = 2;
  o.dim = 4;
  o.bottom = {5, 6};
  o.top = {7};
  auto model = MakeDlrm(o);
  model->Initialize(0);
  ASSERT_TRUE(model->waits_for_params());
  std::vector<size_t> ready, waited;
  model->set_grad_ready([&](size_t t) { ready.push_back(t); });
  model->set_param_wait([&](size_t t) { waited.push_back(t); });
  HandBatch h = RandomBatch(5, 3, 2, 50, 9);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(h.View(), &ids).ok());
  model->ForwardBackward(h.View());
  // bottom.fc1..fc3 = tensors 0..5, top.fc1..fc2 = 6..9.
  EXPECT_EQ(ready, (std::vector<size_t>{8, 9, 6, 7, 4, 5, 2, 3, 0, 1}));
  EXPECT_EQ(waited, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ready.clear();
  waited.clear();
  model->EvaluateBatch(h.View());
  EXPECT_TRUE(ready.empty());
  EXPECT_TRUE(waited.empty());
}

TEST(DlrmTest, LayoutTablesAndOptions) {
  auto model = MakeDlrm(DlrmOptions{});  // the defaults: 13 dense, 26 tables, dim 16, {64}, {64}
  const auto& l = model->layout();
  ASSERT_EQ(l.size(), 8u);
  EXPECT_EQ(l[0].name, "bottom.fc1.weight");
  EXPECT_EQ(l[0].shape, (std::vector<int64_t>{13, 64}));
  EXPECT_EQ(l[3].name, "bottom.fc2.bias");
  EXPECT_EQ(l[3].shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(l[4].name, "top.fc1.weight");
  EXPECT_EQ(l[4].shape, (std::vector<int64_t>{16 + 27 * 26 / 2, 64}));
  EXPECT_EQ(l[7].name, "top.fc2.bias");
  EXPECT_EQ(l[7].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(model->num_params(), 13 * 64 + 64 + 64 * 16 + 16 + 367 * 64 + 64 + 64 + 1);
  ASSERT_EQ(model->tables().size(), 26u);
  for (size_t f = 0; f < 26; ++f) {
    const TableSpec& t = model->tables()[f];
    EXPECT_EQ(t.name, "table." + std::to_string(f));
    EXPECT_EQ(t.dim, 16);
    EXPECT_EQ(t.num_ids, 0u);
    EXPECT_EQ(t.init.kind, RowInit::Kind::kNormal);
    EXPECT_FLOAT_EQ(t.init.scale, 0.01f);
    EXPECT_TRUE(ValidateTableSpec(t).ok());
  }
  DlrmOptions fixed;
  fixed.ids_per_table = 10000;
  fixed.max_rows_per_shard = 77;
  fixed.optimizer.kind = RowOptimizerKind::kAdagrad;
  auto m2 = MakeDlrm(fixed);
  EXPECT_EQ(m2->tables()[3].num_ids, 10000u);
  EXPECT_EQ(m2->tables()[3].init.kind, RowInit::Kind::kUniform);
  EXPECT_FLOAT_EQ(m2->tables()[3].init.scale, 0.01f);  // sqrt(1 / 10^4)
  EXPECT_EQ(m2->tables()[3].max_rows_per_shard, 77);
  EXPECT_EQ(m2->tables()[3].optimizer.kind, RowOptimizerKind::kAdagrad);
  fixed.init = RowInit{RowInit::Kind::kZeros, 0.0f};
  EXPECT_EQ(MakeDlrm(fixed)->tables()[0].init.kind, RowInit::Kind::kZeros);

  auto refused = [](auto change) {
    ModelOptions mo;
    mo.name = "dlrm";
    change(mo);
    Status st = CreateModel(mo).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st;
    return st.message();
  };
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.num_dense = 0; }).find("num_dense"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.num_tables = 0; }).find("num_tables"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.num_tables = 5000; }).find("num_tables"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.dim = 0; }).find("dim"), std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) {
              m.dlrm.bottom = {64, 0};
            }).find("bottom"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.top = {-3}; }).find("top"), std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.max_rows_per_shard = 0; }).find("table.0"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) {
              m.dlrm.init = RowInit{RowInit::Kind::kNormal, -1.0f};
            }).find("scale"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.dlrm.optimizer.eps = 0.0; }).find("eps"),
            std::string::npos);
  EXPECT_NE(refused([](ModelOptions& m) { m.precision = Precision::kBf16; }).find("fp32"),
            std::string::npos);
  ModelOptions unknown;
  unknown.name = "dlrn";
  EXPECT_NE(CreateModel(unknown).status().message().find("dlrm"), std::string::npos);
}

// Trains `steps` steps of plain SGD (dense) and row SGD (rows held in RowTables) from `seed`;
// returns the parameters followed by every row the steps touched.
std::vector<float> TrainBits(uint64_t seed, int steps) {
  DlrmOptions o;
  o.num_dense = 4;
  o.num_tables = 3;
  o.dim = 4;
  o.ids_per_table = 50;
  o.bottom = {8};
  o.top = {8};
  auto model = MakeDlrm(o);
  model->Initialize(seed);
  std::vector<RowTable> tables;
  for (const TableSpec& spec : model->tables()) tables.emplace_back(spec, 0, 1);
  std::vector<std::vector<uint64_t>> ids;
  std::set<std::pair<size_t, uint64_t>> touched;
  for (int s = 0; s < steps; ++s) {
    HandBatch h = RandomBatch(16, 4, 3, 50, 100 + static_cast<uint64_t>(s));
    GRADSYNC_CHECK(model->TableIds(h.View(), &ids).ok());
    size_t at = 0;
    for (size_t f = 0; f < tables.size(); ++f) {
      tables[f].Read(ids[f], model->table_rows().data() + at);
      at += ids[f].size() * 4;
      for (uint64_t id : ids[f]) touched.insert({f, id});
    }
    model->ForwardBackward(h.View());
    Axpy(-0.1f, model->grads(), model->params());
    at = 0;
    for (size_t f = 0; f < tables.size(); ++f) {
      GRADSYNC_CHECK(
          tables[f].Apply(ids[f], model->table_grads().data() + at, 0.1f, 1.0f, 1.0f).ok());
      at += ids[f].size() * 4;
    }
  }
  std::vector<float> out(model->params().begin(), model->params().end());
  for (const auto& [f, id] : touched) {
    float row[4];
    tables[f].Read(std::span<const uint64_t>(&id, 1), row);
    out.insert(out.end(), row, row + 4);
  }
  return out;
}

TEST(DlrmTest, SameSeedSameBits) {
  DlrmOptions o;
  auto a = MakeDlrm(o), b = MakeDlrm(o);
  a->Initialize(3);
  b->Initialize(3);
  EXPECT_EQ(0, std::memcmp(a->params().data(), b->params().data(), a->params().size_bytes()));
  std::set<uint64_t> seeds;
  for (size_t f = 0; f < a->tables().size(); ++f) {
    EXPECT_EQ(a->tables()[f].init_seed, b->tables()[f].init_seed);
    seeds.insert(a->tables()[f].init_seed);
  }
  EXPECT_EQ(seeds.size(), a->tables().size());  // each table its own rows
  b->Initialize(4);
  EXPECT_NE(0, std::memcmp(a->params().data(), b->params().data(), a->params().size_bytes()));
  EXPECT_NE(a->tables()[0].init_seed, b->tables()[0].init_seed);
  // nn.Linear's bound.
  for (float w : a->tensor(0)) EXPECT_LE(std::fabs(w), 1.0f / std::sqrt(13.0f));

  const std::vector<float> x = TrainBits(7, 20), y = TrainBits(7, 20), z = TrainBits(8, 20);
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  EXPECT_NE(x, z);
}

TEST(DlrmTest, PredictAndEvaluateAgree) {
  DlrmOptions o;
  o.num_dense = 3;
  o.num_tables = 2;
  o.dim = 4;
  o.ids_per_table = 30;
  auto model = MakeDlrm(o);
  model->Initialize(6);
  for (float& w : model->params()) w *= 3.0f;
  HandBatch h = RandomBatch(40, 3, 2, 30, 12);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE(model->TableIds(h.View(), &ids).ok());
  Rng rng(2);
  for (float& r : model->table_rows()) r = static_cast<float>(rng.Normal());
  std::vector<float> p;
  ASSERT_TRUE(model->Predict(h.View(), &p).ok());
  ASSERT_EQ(p.size(), 40u);
  const EvalStats s = model->EvaluateBatch(h.View());
  EXPECT_EQ(s.count, 40);
  double loss = 0.0;
  int64_t correct = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double q = p[i];
    loss -= h.labels[i] == 1 ? std::log(q) : std::log1p(-q);
    correct += ((p[i] > 0.5f) == (h.labels[i] == 1)) ? 1 : 0;
  }
  EXPECT_NEAR(s.loss_sum, loss, 1e-4 * loss);
  EXPECT_EQ(s.correct, correct);
  EXPECT_GT(correct, 0);
  EXPECT_LT(correct, 40);
  // ForwardBackward's mean loss is EvaluateBatch's sum over the batch size.
  EXPECT_NEAR(model->ForwardBackward(h.View()), s.loss_sum / 40.0, 1e-5);

  // sparse_logreg: sigmoid of its margin; the dense models: no Predict.
  SparseLogReg lr(6);
  lr.Initialize(0);
  lr.params()[0] = static_cast<float>(rng.Normal());
  HandBatch sparse;
  sparse.size = 2;
  sparse.row_ptr = {0, 2, 3};
  sparse.keys = {1, 5, 9};
  std::vector<float> values{1.0f, 2.0f, -1.0f};
  sparse.labels = {1, 0};
  Batch sb = sparse.View();
  sb.x = nullptr;
  sb.values = values;
  std::vector<std::vector<uint64_t>> lr_ids;
  ASSERT_TRUE(lr.TableIds(sb, &lr_ids).ok());
  ASSERT_EQ(lr_ids[0], (std::vector<uint64_t>{1, 5, 9}));
  const float w1 = static_cast<float>(rng.Normal()), w5 = static_cast<float>(rng.Normal()),
              w9 = static_cast<float>(rng.Normal());
  lr.table_rows()[0] = w1;
  lr.table_rows()[1] = w5;
  lr.table_rows()[2] = w9;
  ASSERT_TRUE(lr.Predict(sb, &p).ok());
  const float bias = lr.params()[0];
  const double z0 = bias + w1 + 2.0 * w5, z1 = bias - w9;
  EXPECT_NEAR(p[0], 1.0 / (1.0 + std::exp(-z0)), 1e-6);
  EXPECT_NEAR(p[1], 1.0 / (1.0 + std::exp(-z1)), 1e-6);
  ModelOptions mlp;
  mlp.name = "mlp";
  mlp.input_dim = 4;
  auto dense = CreateModel(mlp);
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ((*dense)->Predict(sb, &p).code(), StatusCode::kUnimplemented);
}

TEST(DlrmTest, ClickBatchViewSharesTheIds) {
  ClickLogOptions co;
  co.num_dense = 3;
  co.num_categorical = 5;
  co.ids_per_feature = {100};
  auto log = ClickLog::Create(co);
  ASSERT_TRUE(log.ok());
  ClickBatch clicks;
  log->Fill(10, 7, &clicks);
  std::vector<int64_t> row_ptr;
  const Batch b = ClickBatchView(clicks, &row_ptr);
  EXPECT_EQ(b.size, 7);
  EXPECT_EQ(b.dim, 3);
  EXPECT_EQ(b.x, clicks.dense.data());
  EXPECT_EQ(b.keys.data(), clicks.ids.data());
  EXPECT_EQ(b.keys.size(), 35u);
  EXPECT_EQ(b.labels.data(), clicks.labels.data());
  EXPECT_EQ(row_ptr, (std::vector<int64_t>{0, 5, 10, 15, 20, 25, 30, 35}));
}

// The click log learned with one RowTable per table (shard 0 of 1, row-wise Adagrad) and plain SGD
// for the MLPs: 8 features of 1000 ids (Zipf 1.05), 4 dense, planted_scale 0.5; 600 steps of 256
// (153,600 examples, each id of a feature seen 150 times on average, the tail's far fewer), then
// 20,000 held-out examples. Measured (Release): AUC 0.778 against the oracle's 0.807 (0.604 as
// initialized), log loss 0.472 against the oracle's 0.447 and the positive rate's 0.572; about
// 0.2 s of training. Plain row SGD needs a rate near 3 (a row's gradient carries 1/batch per
// example) and reaches 0.742 in these steps.
TEST(DlrmTrainTest, LearnsTheClickLogNearTheOraclesAuc) {
  ClickLogOptions co;
  co.num_dense = 4;
  co.num_categorical = 8;
  co.ids_per_feature = {1000};
  co.planted_scale = 0.5;  // twice the default's: most of what can be learned is in the rows
  co.seed = 3;
  auto log = ClickLog::Create(co);
  ASSERT_TRUE(log.ok()) << log.status();
  DlrmOptions o;
  o.num_dense = co.num_dense;
  o.num_tables = co.num_categorical;
  o.dim = 8;
  o.ids_per_table = 1000;
  o.bottom = {16};
  o.top = {16};
  o.optimizer.kind = RowOptimizerKind::kAdagrad;
  auto model = MakeDlrm(o);
  model->Initialize(1);
  std::vector<RowTable> tables;
  for (const TableSpec& spec : model->tables()) tables.emplace_back(spec, 0, 1);

  constexpr int kSteps = 600;
  constexpr int64_t kBatch = 256, kTest = 20000;
  constexpr float kDenseLr = 0.3f, kRowLr = 0.1f;
  ClickBatch clicks;
  std::vector<int64_t> row_ptr;
  std::vector<std::vector<uint64_t>> ids;
  auto read_rows = [&] {
    size_t at = 0;
    for (size_t f = 0; f < tables.size(); ++f) {
      tables[f].Read(ids[f], model->table_rows().data() + at);
      at += ids[f].size() * static_cast<size_t>(o.dim);
    }
  };
  std::vector<float> probabilities, piece;
  std::vector<int32_t> labels;
  // Test AUC and log loss over [kTestBegin, kTestBegin + kTest).
  auto evaluate = [&] {
    probabilities.clear();
    labels.clear();
    for (int64_t at = 0; at < kTest; at += 1000) {
      log->Fill(ClickLog::kTestBegin + at, 1000, &clicks);
      const Batch batch = ClickBatchView(clicks, &row_ptr);
      GRADSYNC_CHECK(model->TableIds(batch, &ids).ok());
      read_rows();
      GRADSYNC_CHECK(model->Predict(batch, &piece).ok());
      probabilities.insert(probabilities.end(), piece.begin(), piece.end());
      labels.insert(labels.end(), clicks.labels.begin(), clicks.labels.end());
    }
    return std::pair(Auc(probabilities, labels), MeanLogLoss(probabilities, labels));
  };
  const ClickOracleMetrics oracle = log->OracleMetrics(ClickLog::kTestBegin, kTest);
  const auto [auc0, log_loss0] = evaluate();
  // The test can tell: the model as initialized is far from the oracle.
  EXPECT_LT(auc0, oracle.auc - 0.15);

  const auto begin = std::chrono::steady_clock::now();
  for (int s = 0; s < kSteps; ++s) {
    log->Fill(s * kBatch, kBatch, &clicks);
    const Batch batch = ClickBatchView(clicks, &row_ptr);
    ASSERT_TRUE(model->TableIds(batch, &ids).ok());
    read_rows();
    model->ForwardBackward(batch);
    Axpy(-kDenseLr, model->grads(), model->params());
    size_t at = 0;
    for (size_t f = 0; f < tables.size(); ++f) {
      ASSERT_TRUE(
          tables[f].Apply(ids[f], model->table_grads().data() + at, kRowLr, 1.0f, 1.0f).ok());
      at += ids[f].size() * static_cast<size_t>(o.dim);
    }
  }
  const double train_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();

  const auto [auc, log_loss] = evaluate();
  const double rate = oracle.positive_rate;
  const double baseline = -(rate * std::log(rate) + (1 - rate) * std::log(1 - rate));
  std::printf(
      "dlrm on the click log: %d steps of %lld in %.2f s; test AUC %.4f (oracle %.4f, untrained "
      "%.4f), "
      "log loss %.4f (oracle %.4f, untrained %.4f, the positive rate %.3f for all: %.4f)\n",
      kSteps, static_cast<long long>(kBatch), train_s, auc, oracle.auc, auc0, log_loss,
      oracle.log_loss, log_loss0, rate, baseline);
  EXPECT_GT(auc, oracle.auc - 0.05);
  EXPECT_LT(log_loss, baseline - 0.5 * (baseline - oracle.log_loss));
}

}  // namespace
}  // namespace gradsync
