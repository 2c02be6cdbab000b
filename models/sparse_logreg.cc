#include "models/sparse_logreg.h"

#include <algorithm>
#include <cmath>

#include "common/base/check.h"

namespace gradsync {

SparseLogReg::SparseLogReg(int feature_bits) : num_features_(uint64_t{1} << feature_bits) {
  std::vector<TensorInfo> t;
  t.push_back({"weight", {static_cast<int64_t>(num_features_)}, 0, 0, /*sparse=*/true});
  t.push_back({"bias", {1}});
  SetLayout(std::move(t));
  scratch_.assign(num_features_, 0.0f);
  touched_.assign(num_features_, 0);
}

void SparseLogReg::Initialize(uint64_t /*seed*/) { Fill(params(), 0.0f); }

const SparseGrad& SparseLogReg::sparse_grad(size_t i) const {
  GRADSYNC_CHECK(i == 0) << "tensor " << i << " of sparse_logreg is dense";
  return weight_grad_;
}

double SparseLogReg::Margin(const Batch& batch, int64_t row) const {
  const float* w = params_.data();
  double z = params_[static_cast<size_t>(layout_[1].offset)];
  for (int64_t j = batch.row_ptr[row]; j < batch.row_ptr[row + 1]; ++j) {
    const uint64_t k = batch.keys[j];
    GRADSYNC_CHECK(k < num_features_) << "feature " << k << " outside 2^bits = " << num_features_;
    z += static_cast<double>(w[k]) * batch.values[j];
  }
  return z;
}

namespace {
// log(1 + e^z) - y z, computed without overflow.
double BinaryCrossEntropy(double z, int32_t y) {
  return std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::fabs(z)));
}
}  // namespace

float SparseLogReg::ForwardBackward(const Batch& batch) {
  const int64_t b = batch.size;
  GRADSYNC_CHECK(b > 0 && batch.row_ptr.size() == static_cast<size_t>(b + 1))
      << "sparse_logreg needs sparse (CSR) batches";
  const double inv_b = 1.0 / static_cast<double>(b);
  double loss = 0.0, bias_grad = 0.0;
  weight_grad_.keys.clear();
  for (int64_t i = 0; i < b; ++i) {
    const int32_t y = batch.labels[i];
    GRADSYNC_CHECK(y == 0 || y == 1) << "label " << y;
    const double z = Margin(batch, i);
    loss += BinaryCrossEntropy(z, y);
    const double p = 1.0 / (1.0 + std::exp(-z));
    const float dz = static_cast<float>((p - y) * inv_b);
    bias_grad += dz;
    for (int64_t j = batch.row_ptr[i]; j < batch.row_ptr[i + 1]; ++j) {
      const uint64_t k = batch.keys[j];
      if (!touched_[k]) {
        touched_[k] = 1;
        weight_grad_.keys.push_back(k);
      }
      scratch_[k] += dz * batch.values[j];
    }
  }
  std::sort(weight_grad_.keys.begin(), weight_grad_.keys.end());
  weight_grad_.values.resize(weight_grad_.keys.size());
  for (size_t i = 0; i < weight_grad_.keys.size(); ++i) {
    weight_grad_.values[i] = scratch_[weight_grad_.keys[i]];
    scratch_[weight_grad_.keys[i]] = 0.0f;
    touched_[weight_grad_.keys[i]] = 0;
  }
  grads_[static_cast<size_t>(layout_[1].offset)] = static_cast<float>(bias_grad);
  GradReady(1);
  GradReady(0);
  return static_cast<float>(loss * inv_b);
}

EvalStats SparseLogReg::EvaluateBatch(const Batch& batch) {
  EvalStats s;
  for (int64_t i = 0; i < batch.size; ++i) {
    const double z = Margin(batch, i);
    const int32_t y = batch.labels[i];
    s.loss_sum += BinaryCrossEntropy(z, y);
    s.correct += ((z > 0.0) == (y == 1)) ? 1 : 0;
  }
  s.count = batch.size;
  return s;
}

Status SparseLogReg::Predict(const Batch& batch, std::vector<float>* probabilities) {
  probabilities->resize(static_cast<size_t>(std::max<int64_t>(batch.size, 0)));
  for (int64_t i = 0; i < batch.size; ++i) {
    const double z = Margin(batch, i);
    (*probabilities)[static_cast<size_t>(i)] = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
  }
  return OkStatus();
}

}  // namespace gradsync
