// SparseAverager: how AllreduceSync averages a step's sparse gradients. Their keys differ per
// rank, so each sparse tensor's (key, value) pairs are all-gathered and summed per key in rank
// order (the same sum on every rank), then divided by the ranks: merged(t), sorted by key, what
// the optimizer's sparse step applies.
#pragma once

#include <cstddef>
#include <vector>

#include "allreduce/collective.h"
#include "common/base/status.h"
#include "models/model.h"

namespace gradsync {

class SparseAverager {
 public:
  // Every sparse tensor of `model` averaged over `collective` (dense tensors skipped).
  Status Average(const Model& model, Collective& collective);
  // Tensor t's average (after Average; sparse tensors only).
  const SparseGrad& merged(size_t t) const { return merged_[t]; }

 private:
  std::vector<std::vector<std::byte>> gathered_;  // one tensor's pairs, per rank
  std::vector<SparseGrad> merged_;                 // per tensor, for sparse tensors
};

}  // namespace gradsync
