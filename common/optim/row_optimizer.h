// Optimizers of embedding-table rows: one update per row a gradient touched, with state kept only
// for rows (the shards' tables: server/shard/table/; the single-process reference the equivalence
// tests step against). A row is `dim` floats w; its gradient g (the sum over a batch's examples
// that read the row, already scaled by the caller); lr the step's rate.
//
// SGD:             w -= lr * g
// Row-wise Adagrad (FBGEMM's and TorchRec's EXACT_ROWWISE_ADAGRAD: one accumulator per row, not
//                  per element, so its state is one float a row):
//                    G += mean_j(g_j * g_j)          (G starts at initial_accumulator)
//                    w -= lr * g / (sqrt(G) + eps)
// Lazy Adam (torch.optim.SparseAdam's and TensorFlow's LazyAdam rule, with the step count kept
//                  per row: a row's moments and t move only when a gradient touches it):
//                    t += 1
//                    m = beta1 * m + (1 - beta1) * g
//                    v = beta2 * v + (1 - beta2) * g * g
//                    w -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Bias corrections in double, element-wise work in float, as common/optim/optimizer.h's Adam.
// No weight decay: a row decays only when touched, which is not what weight decay means.
// Thread safety: none needed; Step touches only the row it is given.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/base/status.h"

namespace gradsync {

enum class RowOptimizerKind { kSgd, kAdagrad, kAdam };

// "sgd" | "adagrad" | "adam": the names flags, job configs and checkpoints use.
const char* RowOptimizerKindName(RowOptimizerKind kind);
Result<RowOptimizerKind> ParseRowOptimizerKind(const std::string& name);

struct RowOptimizerOptions {
  RowOptimizerKind kind = RowOptimizerKind::kSgd;
  double eps = 1e-8;                 // adagrad and adam
  float initial_accumulator = 0.0f;  // adagrad: G of a new row
  double beta1 = 0.9;                // adam
  double beta2 = 0.999;
};

// kInvalidArgument, one line: eps <= 0 or not finite, a negative or non-finite initial
// accumulator, betas outside [0, 1).
Status ValidateRowOptimizerOptions(const RowOptimizerOptions& options);

class RowOptimizer {
 public:
  RowOptimizer(const RowOptimizerOptions& options, int dim);

  const RowOptimizerOptions& options() const { return options_; }
  int dim() const { return dim_; }
  // Floats of state per row: sgd 0, adagrad 1 (G), adam 2 * dim (m then v).
  int state_floats() const { return state_floats_; }
  // Whether a row counts its own steps (adam's t): a row's step count is then kept beside it.
  bool counts_steps() const { return options_.kind == RowOptimizerKind::kAdam; }

  // The state of a row no gradient has touched yet (`state` holds state_floats()).
  void InitState(float* state) const;
  // One update of row `w` by `g` * grad_scale at rate lr; `state` is the row's (state_floats()),
  // `*steps` its step count (counts_steps(); may be null otherwise), advanced here.
  void Step(float* w, float* state, int64_t* steps, const float* g, float lr,
            float grad_scale = 1.0f) const;
  // kInvalidArgument naming the first value of a row's state that no optimizer of this kind could
  // hold (not finite; a negative accumulator or second moment), or a negative step count.
  Status CheckState(std::span<const float> state, int64_t steps) const;

 private:
  RowOptimizerOptions options_;
  int dim_;
  int state_floats_;
  float beta1_, beta2_, eps_;  // in float, as the element-wise update uses them
};

}  // namespace gradsync
