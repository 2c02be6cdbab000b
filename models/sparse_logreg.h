// Sparse binary logistic regression over 2^feature_bits hashed features (the classic parameter
// server workload). Tensors: "weight" [2^feature_bits] (sparse: a batch's gradient touches only
// the keys present in it) and "bias" [1] (dense). Loss: mean binary cross-entropy; labels 0/1.
// Weights start at zero, as is usual for this model (the seed is accepted and unused).
#pragma once

#include <vector>

#include "models/model.h"

namespace gradsync {

class SparseLogReg final : public Model {
 public:
  explicit SparseLogReg(int feature_bits);

  std::string name() const override { return "sparse_logreg"; }
  void Initialize(uint64_t seed) override;
  float ForwardBackward(const Batch& batch) override;
  EvalStats EvaluateBatch(const Batch& batch) override;
  Status Predict(const Batch& batch, std::vector<float>* probabilities) override;
  const SparseGrad& sparse_grad(size_t i) const override;

 private:
  double Margin(const Batch& batch, int64_t row) const;

  uint64_t num_features_;
  SparseGrad weight_grad_;
  // Dense accumulator and touched-marks for the batch's keys; all zero between calls.
  std::vector<float> scratch_;
  std::vector<uint8_t> touched_;
};

}  // namespace gradsync
