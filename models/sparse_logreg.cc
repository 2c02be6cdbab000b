#include "models/sparse_logreg.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/base/check.h"

namespace gradsync {

SparseLogReg::SparseLogReg(int feature_bits) : num_features_(uint64_t{1} << feature_bits) {
  SetLayout({{"bias", {1}}});
  TableSpec weight;
  weight.name = "weight";
  weight.dim = 1;
  weight.num_ids = num_features_;
  weight.init.kind = RowInit::Kind::kZeros;
  // Every feature fits: what the dense vector held, a shard may hold.
  weight.max_rows_per_shard = static_cast<int64_t>(std::min<uint64_t>(num_features_, kMaxTableRowsPerShard));
  SetTables({weight});
}

void SparseLogReg::Initialize(uint64_t /*seed*/) { Fill(params(), 0.0f); }

Status SparseLogReg::TableIds(const Batch& batch, std::vector<std::vector<uint64_t>>* ids) {
  ids->assign(1, {});
  ids_batch_size_ = -1;
  ids_.clear();
  SizeTableRows(0);
  const int64_t b = batch.size;
  if (b < 0 || batch.row_ptr.size() != static_cast<size_t>(b + 1) || batch.row_ptr[0] < 0 ||
      batch.row_ptr[static_cast<size_t>(b)] < batch.row_ptr[0] ||
      batch.row_ptr[static_cast<size_t>(b)] > static_cast<int64_t>(batch.keys.size())) {
    return InvalidArgumentError("sparse_logreg: a batch of " + std::to_string(b) +
                                " examples needs CSR row offsets within its keys");
  }
  // The batch's keys: [row_ptr[0], row_ptr[b]) of batch.keys (a slice of a data set's).
  const auto first = static_cast<size_t>(batch.row_ptr[0]);
  const auto end = static_cast<size_t>(batch.row_ptr[static_cast<size_t>(b)]);
  if (end - first > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("sparse_logreg: a batch of " + std::to_string(end - first) + " keys is too large");
  }
  for (size_t j = first; j < end; ++j) {
    if (batch.keys[j] >= num_features_) {
      return InvalidArgumentError("table 'weight': feature " + std::to_string(batch.keys[j]) + " is outside [0, " +
                                  std::to_string(num_features_) + ") (2^feature_bits)");
    }
  }
  ids_.assign(batch.keys.begin() + static_cast<std::ptrdiff_t>(first),
              batch.keys.begin() + static_cast<std::ptrdiff_t>(end));
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  first_key_ = first;
  row_of_.resize(end - first);
  for (size_t j = first; j < end; ++j) {
    row_of_[j - first] =
        static_cast<uint32_t>(std::lower_bound(ids_.begin(), ids_.end(), batch.keys[j]) - ids_.begin());
  }
  (*ids)[0] = ids_;
  SizeTableRows(ids_.size());
  ids_batch_size_ = b;
  return OkStatus();
}

void SparseLogReg::CheckBatch(const Batch& batch) const {
  GRADSYNC_CHECK(ids_batch_size_ == batch.size && batch.row_ptr.size() == static_cast<size_t>(batch.size + 1) &&
                 batch.row_ptr[0] == static_cast<int64_t>(first_key_) &&
                 row_of_.size() == static_cast<size_t>(batch.row_ptr[static_cast<size_t>(batch.size)]) - first_key_)
      << "sparse_logreg: call TableIds on the batch (" << batch.size << " examples) before the model reads it";
  for (size_t j = 0; j < row_of_.size(); ++j) {
    GRADSYNC_CHECK(ids_[row_of_[j]] == batch.keys[first_key_ + j])
        << "sparse_logreg: key " << batch.keys[first_key_ + j] << " was not named by TableIds: call it on this batch first";
  }
}

namespace {
// The row of the batch's key j (an index into batch.keys).
size_t SparseLogRegRow(const std::vector<uint32_t>& row_of, size_t first_key, int64_t j) {
  return row_of[static_cast<size_t>(j) - first_key];
}
}  // namespace

double SparseLogReg::Margin(const Batch& batch, int64_t row) const {
  double z = params_[static_cast<size_t>(layout_[0].offset)];
  for (int64_t j = batch.row_ptr[row]; j < batch.row_ptr[row + 1]; ++j) {
    z += static_cast<double>(table_rows_[SparseLogRegRow(row_of_, first_key_, j)]) * batch.values[j];
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
  GRADSYNC_CHECK(b > 0) << "sparse_logreg needs a non-empty batch";
  CheckBatch(batch);
  const double inv_b = 1.0 / static_cast<double>(b);
  double loss = 0.0, bias_grad = 0.0;
  FloatSpan row_grads = table_grads_mutable();
  std::fill(row_grads.begin(), row_grads.end(), 0.0f);
  for (int64_t i = 0; i < b; ++i) {
    const int32_t y = batch.labels[i];
    GRADSYNC_CHECK(y == 0 || y == 1) << "label " << y;
    const double z = Margin(batch, i);
    loss += BinaryCrossEntropy(z, y);
    const double p = 1.0 / (1.0 + std::exp(-z));
    const float dz = static_cast<float>((p - y) * inv_b);
    bias_grad += dz;
    for (int64_t j = batch.row_ptr[i]; j < batch.row_ptr[i + 1]; ++j) {
      row_grads[SparseLogRegRow(row_of_, first_key_, j)] += dz * batch.values[j];
    }
  }
  grads_[static_cast<size_t>(layout_[0].offset)] = static_cast<float>(bias_grad);
  GradReady(0);
  return static_cast<float>(loss * inv_b);
}

EvalStats SparseLogReg::EvaluateBatch(const Batch& batch) {
  CheckBatch(batch);
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
  CheckBatch(batch);
  probabilities->resize(static_cast<size_t>(std::max<int64_t>(batch.size, 0)));
  for (int64_t i = 0; i < batch.size; ++i) {
    const double z = Margin(batch, i);
    (*probabilities)[static_cast<size_t>(i)] = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
  }
  return OkStatus();
}

}  // namespace gradsync
