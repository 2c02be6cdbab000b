// Optimizers on flat float buffers: PyTorch's SGD rule (momentum, Nesterov, weight decay),
// torch.optim.Adam (PyTorch 1.13, foreach=False, amsgrad=False), operation by operation, and the
// layer-wise adaptive rates LARS and LAMB.
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
// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"; the momentum form of
// NVIDIA's and MLPerf's implementations), per layer (eta: trust_coefficient, mu: momentum):
//   g' = g + weight_decay * w
//   trust = eta * ||w|| / (||g|| + weight_decay * ||w||)     (1 when ||w|| or ||g|| is 0)
//   b = mu * b + (lr * trust) * g'                             (b starts at 0)
//   w -= b
//
// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2), per layer,
// t as Adam's (beta1, beta2, eps: Adam's options; weight decay is decoupled, as AdamW's):
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w
//   trust = ||w|| / ||r||                                      (1 when ||w|| or ||r|| is 0)
//   w -= lr * trust * r
//
// Layers (SetLayers, built by OptimizerLayers from a model's layout): the trust ratio is a
// layer's. A layer that does not adapt (a bias, any 1-D tensor) takes trust = 1 and no weight
// decay: LARS is then SGD with momentum at lr, LAMB bias-corrected Adam. Norms are computed in
// double over the part of a layer that one Step call covers: a Step call for LARS or LAMB is cut
// at the layer boundaries, and each piece's norms are that piece's. So a caller must pass whole
// layers (or the whole intersection of a layer with its range: a server shard's, a ZeRO shard's)
// in one Step call, never a layer in two calls. Element-wise work is in float.
//
// One Optimizer owns the state (momentum buffer; Adam's m and v and its step count) for a flat
// range of `size` parameters; the worker uses one per model, a server shard one per key range
// it owns. The learning rate is passed per step so that a schedule (LrSchedule) can drive it.
// One optimizer step may update the range in several Step calls (dense runs, the segments and
// parts of a push); EndStep() ends it, so Adam's every Step call until then uses the same t.
// Not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"

namespace gradsync {

enum class OptimizerKind { kSgd, kAdam, kLars, kLamb };

// "sgd" | "adam" | "lars" | "lamb": the names flags, job configs and checkpoints use.
const char* OptimizerKindName(OptimizerKind kind);
Result<OptimizerKind> ParseOptimizerKind(const std::string& name);

struct OptimizerOptions {
  float momentum = 0.0f;      // SGD and LARS: 0 = no momentum
  bool nesterov = false;      // SGD: requires momentum > 0
  // SGD, Adam, LARS: L2 coefficient added to the gradient; LAMB: decoupled (in r, above).
  float weight_decay = 0.0f;
  OptimizerKind kind = OptimizerKind::kSgd;
  // Adam and LAMB, torch.optim.Adam's defaults. Doubles, as PyTorch's Python floats: the bias
  // corrections use them as they are; the element-wise update uses them rounded to float, as
  // PyTorch does. (LAMB's paper uses eps 1e-6; the default here stays Adam's 1e-8.)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // LARS: the trust coefficient eta.
  double trust_coefficient = 0.001;
};

// Rejects negative or non-finite values, nesterov without momentum, for Adam and LAMB betas
// outside [0, 1), eps <= 0, and momentum or nesterov (SGD's); for LARS nesterov and a trust
// coefficient <= 0.
Status ValidateOptimizerOptions(const OptimizerOptions& options);

// Whether the kind adapts its rate per layer (LARS, LAMB): it needs whole layers per Step call.
bool IsLayerWise(OptimizerKind kind);

// The optimizer's state vectors ("slots"), each as long as the range, in state()'s order, named
// as torch.optim names the state it keeps per parameter where they mean the same: SGD
// {"momentum_buffer"} with momentum > 0 (torch's buffer exactly: b = momentum * b + g', w -= lr * b,
// the first b = g'; none without momentum), Adam {"exp_avg", "exp_avg_sq"} (torch's m and v),
// LARS {"momentum_buffer"} (its b: the rate is inside it, b = mu * b + lr * trust * g', w -= b),
// LAMB {"exp_avg", "exp_avg_sq"}. Every kind also counts its steps (Optimizer::steps(): Adam's
// and LAMB's t, torch's state["step"]).
std::vector<std::string> OptimizerSlotNames(const OptimizerOptions& options);

// kInvalidArgument naming the first element of state vector `slot` (OptimizerSlotNames' order)
// that no optimizer of this kind could hold: one that is not finite, or a negative second moment
// (Adam's and LAMB's v).
Status CheckOptimizerSlot(OptimizerKind kind, int slot, std::span<const float> values);

// One layer inside an optimizer's range, in the optimizer's own coordinates (0 = its first
// element). `adapt` false: no trust ratio (1) and no weight decay (LARS, LAMB).
struct OptimizerLayer {
  int64_t begin = 0;
  int64_t end = 0;
  bool adapt = true;
  bool operator==(const OptimizerLayer&) const = default;
};

// The layers of `range` (a flat range of the model: a server shard's, a ZeRO shard's, or the
// whole model) in that range's coordinates: each tensor of the layout intersected with it, in
// order. A tensor whose name ends in "bias" or whose shape has one dimension does not adapt,
// nor does a sparse one. The one place that decides which tensors LARS and LAMB exclude.
std::vector<OptimizerLayer> OptimizerLayers(const std::vector<TensorInfo>& layout, Segment range);
// Per-tensor step counts (torch's per-parameter "step") against a range's per-layer skipped steps
// (Optimizer::skipped, OptimizerLayers(layout, range)'s layers), both ways.
// SkippedSteps: per layer of the range, `steps` less its tensor's count in `tensor_steps` (one per
// tensor of the layout; empty: every tensor took all `steps`, and so the result is empty).
std::vector<int64_t> SkippedSteps(const std::vector<TensorInfo>& layout, Segment range, int64_t steps,
                                  std::span<const int64_t> tensor_steps);
// TensorSteps: sets in *tensor_steps (one per tensor of the layout, filled with `steps` first when
// empty) the counts of the range's tensors from its layers' `skipped` (empty: nothing to set).
// kDataLoss when `skipped` has not one count per layer of the range.
Status TensorSteps(const std::vector<TensorInfo>& layout, Segment range, int64_t steps,
                   std::span<const int64_t> skipped, std::vector<int64_t>* tensor_steps);

class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, int64_t size);

  // The layers of the range (LARS, LAMB; the others ignore them): sorted, each [begin, end)
  // non-empty, together exactly [0, size). Without a call the whole range is one adapting layer.
  void SetLayers(std::vector<OptimizerLayer> layers);
  const std::vector<OptimizerLayer>& layers() const { return layers_; }

  // Updates params[offset, offset + grad.size()) from grad_scale * grad; `params` is that range.
  // (A scale of 1 is exact, so a scaled step with 1 equals the plain one bit for bit.) Adam and
  // LAMB: part of step steps() + 1, which EndStep() ends. LARS and LAMB: the call is cut at the
  // layer boundaries and each piece's norms are its own (whole layers per call, above).
  void Step(FloatSpan params, ConstFloatSpan grad, float lr, int64_t offset = 0, float grad_scale = 1.0f);

  // Sparse update (SGD only: Adam, LARS and LAMB are refused for sparse models where a job is configured):
  // params[keys[i]] from values[i], where `params` is the range starting at `offset` of this
  // optimizer's state. Keys must be unique. Momentum state is kept per key and advanced only
  // when the key is touched ("lazy" momentum, as sparse PS do).
  void StepSparse(FloatSpan params, std::span<const uint64_t> keys, ConstFloatSpan values,
                  float lr, int64_t offset = 0);

  // Layer `layer` takes no part in the step being made (its tensor got no gradient: it gets no
  // Step call): EndStep leaves that layer's step count where it is, so that Adam's and LAMB's t
  // is per layer, as torch's state["step"] is per parameter. Twice in one step counts once.
  void SkipLayer(size_t layer);
  // Ends one optimizer step (every Step call of one update): steps() += 1, and each layer not
  // skipped in it takes the step too.
  void EndStep();
  // The optimizer steps ended so far (Adam's t before its next step); for checkpoints.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps);
  // Per layer, the steps it skipped (layer l's own t before its next step is steps() - skipped[l]);
  // empty while no layer ever skipped one. For checkpoints and the optimizer state's transfer.
  std::span<const int64_t> skipped() const { return skipped_; }
  // Sets them back: empty, or one count per layer, each in [0, steps()] (checked by the caller:
  // CheckSkippedSteps).
  void set_skipped(std::span<const int64_t> skipped);

  const OptimizerOptions& options() const { return options_; }
  // The state, exposed for checkpoints and tests: SGD's momentum buffer (`size` floats; empty
  // for plain SGD), Adam's and LAMB's m then v (2 * `size` floats), LARS's momentum buffer
  // (`size` floats, with or without momentum).
  std::span<const float> state() const { return state_; }
  // Restores the state from a checkpoint (sizes must match).
  void SetState(std::span<const float> state);
  // The state vectors: OptimizerSlotNames(options()).size(); state() holds num_slots() * size.
  int num_slots() const { return num_slots_; }

 private:
  // t: the step being made, of the layer(s) the call covers.
  void AdamStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale, int64_t t);
  // One piece of one layer (offset: in the optimizer's coordinates).
  void LarsStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale, bool adapt);
  void LambStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale, bool adapt, int64_t t);
  // fn(layer, piece's position in the call, its length, its offset) for each layer [offset,
  // offset + n) reaches, in order.
  template <typename Fn>
  void ForEachLayerPiece(int64_t offset, size_t n, Fn&& fn) const {
    if (n == 0) return;
    const int64_t end = offset + static_cast<int64_t>(n);
    size_t l = static_cast<size_t>(std::upper_bound(layers_.begin(), layers_.end(), offset,
                                                    [](int64_t at, const OptimizerLayer& x) { return at < x.begin; }) -
                                   layers_.begin()) - 1;
    for (int64_t at = offset; at < end; ++l) {
      const int64_t e = std::min(end, layers_[l].end);
      fn(l, static_cast<size_t>(at - offset), static_cast<size_t>(e - at), at);
      at = e;
    }
  }
  // The step layer l is making (its t): steps_ + 1 less what it skipped.
  int64_t LayerT(size_t l) const { return steps_ + 1 - (skipped_.empty() ? 0 : skipped_[l]); }

  OptimizerOptions options_;
  size_t size_ = 0;
  std::vector<OptimizerLayer> layers_;  // LARS, LAMB: cover [0, size_)
  std::vector<float> state_;
  int num_slots_ = 0;
  int64_t steps_ = 0;
  std::vector<int64_t> skipped_;     // per layer; empty: none skipped
  std::vector<uint8_t> skip_now_;    // per layer: skipped in the step being made
  bool skipping_ = false;            // some layer is skipped in the step being made
};

// kInvalidArgument unless `skipped` is empty or holds one count per layer (`layers`), each in
// [0, steps]: what an optimizer state or checkpoint may carry.
Status CheckSkippedSteps(std::span<const int64_t> skipped, size_t layers, int64_t steps);

// The learning rate at each step: an optional linear warm-up from warmup_start to base over
// the first warmup_steps (Goyal et al. 2017), then constant, or a decay from base to
// base * final_fraction over the remaining steps up to total_steps (after that it stays at the
// final value): cosine, or linear (the polynomial decay of power 1 that LARS and LAMB were
// published with).
struct LrSchedule {
  enum class Kind { kConstant, kCosine, kLinear };
  Kind kind = Kind::kConstant;
  float base = 0.1f;
  int64_t total_steps = 0;
  float final_fraction = 0.0f;
  int64_t warmup_steps = 0;
  float warmup_start = 0.0f;

  float At(int64_t step) const;
};

// Parses "constant", "cosine" or "linear"; and the name back.
Result<LrSchedule::Kind> ParseLrScheduleKind(const std::string& text);
const char* LrScheduleKindName(LrSchedule::Kind kind);

}  // namespace gradsync
