// Optimizers on flat float buffers: SGD, momentum, Nesterov, weight decay (PyTorch's SGD rule).
//
//   g' = g + weight_decay * w
//   momentum > 0:  b = momentum * b + g'   (b starts at 0, so the first b equals g')
//                  d = nesterov ? g' + momentum * b : b
//   otherwise      d = g'
//   w -= lr * d
//
// One Optimizer owns the state (momentum buffer) for a flat range of `size` parameters; the
// worker uses one per model, a server shard one per key range it owns. The learning rate is
// passed per step so that a schedule (LrSchedule) can drive it. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace gradsync {

struct OptimizerOptions {
  float momentum = 0.0f;      // 0 = plain SGD
  bool nesterov = false;      // requires momentum > 0
  float weight_decay = 0.0f;  // L2 coefficient added to the gradient
};

// Rejects negative or non-finite values and nesterov without momentum.
Status ValidateOptimizerOptions(const OptimizerOptions& options);

class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, int64_t size);

  // Updates params[offset, offset + grad.size()) from grad_scale * grad; `params` is that range.
  // (A scale of 1 is exact, so a scaled step with 1 equals the plain one bit for bit.)
  void Step(FloatSpan params, ConstFloatSpan grad, float lr, int64_t offset = 0, float grad_scale = 1.0f);

  // Sparse update: params[keys[i]] from values[i], where `params` is the range starting at
  // `offset` of this optimizer's state. Keys must be unique. Momentum state is kept per key and
  // advanced only when the key is touched ("lazy" momentum, as sparse PS do).
  void StepSparse(FloatSpan params, std::span<const uint64_t> keys, ConstFloatSpan values,
                  float lr, int64_t offset = 0);

  const OptimizerOptions& options() const { return options_; }
  // Momentum buffer (empty for plain SGD); exposed for checkpoints and tests.
  std::span<const float> state() const { return velocity_; }
  // Restores the momentum buffer from a checkpoint (sizes must match).
  void SetState(std::span<const float> velocity);

 private:
  OptimizerOptions options_;
  std::vector<float> velocity_;
};

// Learning rate as a function of the global step. Constant, or cosine decay from `base` to
// `base * final_fraction` over `total_steps` (after that it stays at the final value).
// The learning rate at each step: an optional linear warm-up from warmup_start to base over
// the first warmup_steps (Goyal et al. 2017), then constant, or a cosine decay from base to
// base * final_fraction over the remaining steps up to total_steps.
struct LrSchedule {
  enum class Kind { kConstant, kCosine };
  Kind kind = Kind::kConstant;
  float base = 0.1f;
  int64_t total_steps = 0;
  float final_fraction = 0.0f;
  int64_t warmup_steps = 0;
  float warmup_start = 0.0f;

  float At(int64_t step) const;
};

// Parses "constant" or "cosine".
Result<LrSchedule::Kind> ParseLrScheduleKind(const std::string& text);

}  // namespace gradsync
