// Optimizers on flat float buffers: PyTorch's SGD rule (momentum, Nesterov, weight decay) and
// torch.optim.Adam (PyTorch 1.13, foreach=False, amsgrad=False), operation by operation.
//
// SGD:
//   g' = g + weight_decay * w
//   momentum > 0:  b = momentum * b + g'   (b starts at 0, so the first b equals g')
//                  d = nesterov ? g' + momentum * b : b
//   otherwise      d = g'
//   w -= lr * d
//
// Adam (t counts the optimizer's steps, 1 for the first; weight decay is L2 on the gradient, as
// torch.optim.Adam, not AdamW):
//   g' = g + weight_decay * w
//   m = beta1 * m + (1 - beta1) * g'
//   v = beta2 * v + (1 - beta2) * g' * g'
//   bias1 = 1 - beta1^t, bias2 = 1 - beta2^t           (in double, as PyTorch's Python floats)
//   w -= (lr / bias1) * m / (sqrt(v) / sqrt(bias2) + eps)   (element-wise in float)
// Each operation as PyTorch's source writes it. Against torch 1.13 on an AVX2 CPU a step agrees
// to float rounding, not always to the bit: PyTorch's AVX2 kernels fuse three of the multiply-
// adds (weight decay, m, v) into FMAs, and its rate is a double where ours is a float; with both
// emulated, every step of a 20-step check on 1000 parameters was bit-identical.
//
// One Optimizer owns the state (momentum buffer; Adam's m and v and its step count) for a flat
// range of `size` parameters; the worker uses one per model, a server shard one per key range
// it owns. The learning rate is passed per step so that a schedule (LrSchedule) can drive it.
// One optimizer step may update the range in several Step calls (dense runs, the segments and
// parts of a push); EndStep() ends it, so Adam's every Step call until then uses the same t.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace gradsync {

enum class OptimizerKind { kSgd, kAdam };

// "sgd" | "adam": the names flags, job configs and checkpoints use.
const char* OptimizerKindName(OptimizerKind kind);
Result<OptimizerKind> ParseOptimizerKind(const std::string& name);

struct OptimizerOptions {
  float momentum = 0.0f;      // SGD: 0 = plain SGD
  bool nesterov = false;      // SGD: requires momentum > 0
  float weight_decay = 0.0f;  // L2 coefficient added to the gradient (SGD and Adam)
  OptimizerKind kind = OptimizerKind::kSgd;
  // Adam, torch.optim.Adam's defaults. Doubles, as PyTorch's Python floats: the bias corrections
  // use them as they are; the element-wise update uses them rounded to float, as PyTorch does.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Rejects negative or non-finite values, nesterov without momentum, and for Adam betas outside
// [0, 1), eps <= 0, and momentum or nesterov (SGD's).
Status ValidateOptimizerOptions(const OptimizerOptions& options);

class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, int64_t size);

  // Updates params[offset, offset + grad.size()) from grad_scale * grad; `params` is that range.
  // (A scale of 1 is exact, so a scaled step with 1 equals the plain one bit for bit.) Adam: part
  // of step steps() + 1, which EndStep() ends.
  void Step(FloatSpan params, ConstFloatSpan grad, float lr, int64_t offset = 0, float grad_scale = 1.0f);

  // Sparse update (SGD only: Adam is refused for sparse models where a job is configured):
  // params[keys[i]] from values[i], where `params` is the range starting at `offset` of this
  // optimizer's state. Keys must be unique. Momentum state is kept per key and advanced only
  // when the key is touched ("lazy" momentum, as sparse PS do).
  void StepSparse(FloatSpan params, std::span<const uint64_t> keys, ConstFloatSpan values,
                  float lr, int64_t offset = 0);

  // Ends one optimizer step (every Step call of one update): steps() += 1.
  void EndStep() { ++steps_; }
  // The optimizer steps ended so far (Adam's t before its next step); for checkpoints.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps);

  const OptimizerOptions& options() const { return options_; }
  // The state, exposed for checkpoints and tests: SGD's momentum buffer (`size` floats; empty
  // for plain SGD), Adam's m then v (2 * `size` floats).
  std::span<const float> state() const { return state_; }
  // Restores the state from a checkpoint (sizes must match).
  void SetState(std::span<const float> state);

 private:
  void AdamStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale);

  OptimizerOptions options_;
  size_t size_ = 0;
  std::vector<float> state_;
  int64_t steps_ = 0;
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
