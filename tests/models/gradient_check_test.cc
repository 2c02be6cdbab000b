// Finite-difference gradient checks: every model's analytic float gradient against central
// differences of an independent float64 reference implementation of its loss.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/base/numeric/rng.h"
#include "common/data/synthetic.h"
#include "models/model.h"

namespace gradsync {
namespace {

// Mean softmax cross-entropy of an MLP (ReLU hidden layers), all in double. Weights are
// [in, out] row-major, then bias [out], per layer, in the model's flat layout.
double MlpLossRef(const std::vector<double>& p, const std::vector<int64_t>& dims, const Batch& b) {
  double total = 0.0;
  for (int64_t i = 0; i < b.size; ++i) {
    std::vector<double> a(b.x + i * dims[0], b.x + (i + 1) * dims[0]);
    size_t off = 0;
    for (size_t l = 0; l + 1 < dims.size(); ++l) {
      const int64_t din = dims[l], dout = dims[l + 1];
      std::vector<double> z(static_cast<size_t>(dout));
      for (int64_t o = 0; o < dout; ++o) {
        double s = p[off + din * dout + o];
        for (int64_t k = 0; k < din; ++k) s += a[k] * p[off + k * dout + o];
        z[o] = (l + 2 < dims.size()) ? std::max(0.0, s) : s;
      }
      off += din * dout + dout;
      a = z;
    }
    double m = a[0];
    for (double v : a) m = std::max(m, v);
    double sum = 0.0;
    for (double v : a) sum += std::exp(v - m);
    total += std::log(sum) + m - a[b.labels[i]];
  }
  return total / b.size;
}

double LogRegLossRef(const std::vector<double>& p, int64_t bias_index, const Batch& b) {
  double total = 0.0;
  for (int64_t i = 0; i < b.size; ++i) {
    double z = p[bias_index];
    for (int64_t j = b.row_ptr[i]; j < b.row_ptr[i + 1]; ++j) z += p[b.keys[j]] * b.values[j];
    const double y = b.labels[i];
    total += std::log1p(std::exp(-std::fabs(z))) + std::max(z, 0.0) - y * z;
  }
  return total / b.size;
}

// Central difference of `loss` at coordinate i; h scaled to the parameter.
template <typename F>
double NumericGrad(std::vector<double>& p, size_t i, F&& loss) {
  const double h = 1e-6 * std::max(1.0, std::fabs(p[i]));
  const double keep = p[i];
  p[i] = keep + h;
  double up = loss(p);
  p[i] = keep - h;
  double down = loss(p);
  p[i] = keep;
  return (up - down) / (2 * h);
}

void ExpectClose(double analytic, double numeric, const std::string& where) {
  // Float gradients carry ~1e-6 relative rounding; 1e-3 relative (with an absolute floor for
  // tiny entries) catches any real mistake, which shows up as O(1) relative error.
  EXPECT_NEAR(analytic, numeric, 1e-3 * std::fabs(numeric) + 2e-6) << where;
}

class MlpGradientTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(MlpGradientTest, MatchesFloat64FiniteDifferences) {
  const std::vector<int64_t> hidden = GetParam();
  BlobsOptions bo;
  bo.n = 6;
  bo.dim = 7;
  bo.classes = 4;
  bo.seed = 11;
  Dataset data = MakeGaussianBlobs(bo);
  ModelOptions mo;
  mo.name = hidden.empty() ? "softmax" : "mlp";
  mo.input_dim = 7;
  mo.num_classes = 4;
  mo.hidden = hidden;
  auto model = CreateModel(mo);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->Initialize(5);
  // Larger weights than the default init, so that ReLUs are both on and off.
  for (float& w : (*model)->params()) w *= 3.0f;
  Batch batch = SliceBatch(data, 0, data.n);
  const float loss = (*model)->ForwardBackward(batch);

  std::vector<int64_t> dims = {7};
  dims.insert(dims.end(), hidden.begin(), hidden.end());
  dims.push_back(4);
  std::vector<double> p((*model)->params().begin(), (*model)->params().end());
  auto ref = [&](const std::vector<double>& q) { return MlpLossRef(q, dims, batch); };
  EXPECT_NEAR(loss, ref(p), 1e-5 * std::fabs(ref(p)));
  const auto grads = (*model)->grads();
  for (size_t i = 0; i < p.size(); ++i) {
    ExpectClose(grads[i], NumericGrad(p, i, ref), "parameter " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlpGradientTest,
                         ::testing::Values(std::vector<int64_t>{}, std::vector<int64_t>{5},
                                           std::vector<int64_t>{6, 5}),
                         [](const auto& p) {
                           std::string name = "hidden";
                           for (int64_t h : p.param) {
                             name += '_';
                             name += std::to_string(h);
                           }
                           return p.param.empty() ? std::string("softmax") : name;
                         });

TEST(SparseLogRegGradientTest, MatchesFloat64FiniteDifferencesOnTouchedKeys) {
  SparseLogisticOptions so;
  so.n = 8;
  so.feature_bits = 10;
  so.nnz = 6;
  so.seed = 4;
  Dataset data = MakeSparseLogistic(so);
  ModelOptions mo;
  mo.name = "sparse_logreg";
  mo.feature_bits = 10;
  auto model = CreateModel(mo);
  ASSERT_TRUE(model.ok());
  (*model)->Initialize(0);
  // The reference's parameters: every weight (the table's rows, 2^10 of them), then the bias.
  const int64_t bias_index = int64_t{1} << 10;
  Rng rng(3);
  std::vector<double> p(static_cast<size_t>(bias_index) + 1);
  for (double& w : p) w = static_cast<float>(rng.Normal());
  Batch batch = SliceBatch(data, 0, data.n);
  std::vector<std::vector<uint64_t>> ids;
  ASSERT_TRUE((*model)->TableIds(batch, &ids).ok());
  for (size_t r = 0; r < ids[0].size(); ++r) (*model)->table_rows()[r] = static_cast<float>(p[ids[0][r]]);
  (*model)->params()[0] = static_cast<float>(p[static_cast<size_t>(bias_index)]);
  const float loss = (*model)->ForwardBackward(batch);

  auto ref = [&](const std::vector<double>& q) { return LogRegLossRef(q, bias_index, batch); };
  EXPECT_NEAR(loss, ref(p), 1e-5 * std::fabs(ref(p)));

  std::vector<uint64_t> expected_keys(batch.keys.begin(), batch.keys.end());
  std::sort(expected_keys.begin(), expected_keys.end());
  expected_keys.erase(std::unique(expected_keys.begin(), expected_keys.end()), expected_keys.end());
  EXPECT_EQ(ids[0], expected_keys);  // exactly the keys in the batch, sorted and unique: its rows
  ASSERT_EQ((*model)->table_grads().size(), expected_keys.size());
  for (size_t i = 0; i < expected_keys.size(); ++i) {
    ExpectClose((*model)->table_grads()[i], NumericGrad(p, expected_keys[i], ref),
                "key " + std::to_string(expected_keys[i]));
  }
  ExpectClose((*model)->grads()[0], NumericGrad(p, static_cast<size_t>(bias_index), ref), "bias");
  // A key outside the batch has zero gradient.
  uint64_t untouched = 0;
  while (std::binary_search(expected_keys.begin(), expected_keys.end(), untouched)) ++untouched;
  EXPECT_EQ(NumericGrad(p, untouched, ref), 0.0);
}

}  // namespace
}  // namespace gradsync
