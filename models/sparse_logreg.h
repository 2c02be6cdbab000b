// Sparse binary logistic regression over 2^feature_bits hashed features (the classic parameter
// server workload): margin = bias + sum_j w[key_j] * value_j, loss the mean binary cross-entropy,
// labels 0/1. The weights are an embedding table "weight" of rows of one float (common/table/:
// on the PS shards, in each all-reduce worker's replica, or in the local sync's own copy), zeros
// until a gradient touches them, updated by the rows' SGD: a worker holds only its batch's
// weights, never the 2^bits vector. "bias" [1] is the one dense tensor. Weights start at zero, as
// is usual for this model (the seed is accepted and unused).
#pragma once

#include <vector>

#include "models/model.h"

namespace gradsync {

class SparseLogReg final : public Model {
 public:
  explicit SparseLogReg(int feature_bits);

  std::string name() const override { return "sparse_logreg"; }
  void Initialize(uint64_t seed) override;
  // The batch's keys, sorted and unique (one table); kInvalidArgument naming the table for a key
  // outside [0, 2^feature_bits).
  Status TableIds(const Batch& batch, std::vector<std::vector<uint64_t>>* ids) override;
  float ForwardBackward(const Batch& batch) override;
  EvalStats EvaluateBatch(const Batch& batch) override;
  Status Predict(const Batch& batch, std::vector<float>* probabilities) override;

 private:
  // Fails unless TableIds named this batch's keys.
  void CheckBatch(const Batch& batch) const;
  double Margin(const Batch& batch, int64_t row) const;

  uint64_t num_features_;
  std::vector<uint32_t> row_of_;  // per key of the batch TableIds saw: its row in table_rows()
  size_t first_key_ = 0;          // that batch's first key in batch.keys (row_ptr[0])
  std::vector<uint64_t> ids_;     // that batch's ids (sorted, unique)
  int64_t ids_batch_size_ = -1;   // its size (-1: none)
};

}  // namespace gradsync
