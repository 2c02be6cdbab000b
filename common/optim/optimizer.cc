#include "common/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

namespace gradsync {

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kLars: return "lars";
    case OptimizerKind::kLamb: return "lamb";
    case OptimizerKind::kSgd: break;
  }
  return "sgd";
}

Result<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "lars") return OptimizerKind::kLars;
  if (name == "lamb") return OptimizerKind::kLamb;
  return InvalidArgumentError("optimizer must be sgd, adam, lars or lamb, not '" + name + "'");
}

bool IsLayerWise(OptimizerKind kind) { return kind == OptimizerKind::kLars || kind == OptimizerKind::kLamb; }

std::vector<std::string> OptimizerSlotNames(const OptimizerOptions& o) {
  switch (o.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kLamb: return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kLars: return {"momentum_buffer"};
    case OptimizerKind::kSgd: break;
  }
  if (o.momentum > 0.0f) return {"momentum_buffer"};
  return {};
}

Status CheckOptimizerSlot(OptimizerKind kind, int slot, std::span<const float> values) {
  const bool second_moment = (kind == OptimizerKind::kAdam || kind == OptimizerKind::kLamb) && slot == 1;
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (std::isfinite(v) && !(second_moment && v < 0.0f)) continue;
    return InvalidArgumentError(std::string(OptimizerKindName(kind)) + " state vector " + std::to_string(slot) +
                                ", element " + std::to_string(i) + ": " +
                                (std::isnan(v)          ? "NaN"
                                 : !std::isfinite(v)    ? "infinite"
                                                        : "a negative second moment (" + std::to_string(v) + ")"));
  }
  return OkStatus();
}

namespace {
// OptimizerLayers' walk: the layers and, per layer, its tensor's layout index (-1: a gap).
std::vector<OptimizerLayer> WalkLayers(const std::vector<TensorInfo>& layout, Segment range, std::vector<int>* tensors) {
  std::vector<int> sorted(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) sorted[i] = static_cast<int>(i);
  std::stable_sort(sorted.begin(), sorted.end(), [&](int x, int y) { return layout[x].offset < layout[y].offset; });
  std::vector<OptimizerLayer> layers;
  int64_t covered = range.begin;
  for (int index : sorted) {
    const TensorInfo& t = layout[static_cast<size_t>(index)];
    const int64_t b = std::max({range.begin, t.offset, covered}), e = std::min(range.end, t.offset + t.size);
    if (b >= e) continue;
    // A gap the layout leaves (none of the built-in models has one) is a layer of its own.
    if (b > covered) {
      layers.push_back({covered - range.begin, b - range.begin, false});
      if (tensors) tensors->push_back(-1);
    }
    const bool bias = t.name.size() >= 4 && t.name.compare(t.name.size() - 4, 4, "bias") == 0;
    layers.push_back({b - range.begin, e - range.begin, !(bias || t.shape.size() == 1 || t.sparse)});
    if (tensors) tensors->push_back(index);
    covered = std::max(covered, e);
  }
  if (covered < range.end) {
    layers.push_back({covered - range.begin, range.end - range.begin, false});
    if (tensors) tensors->push_back(-1);
  }
  return layers;
}
}  // namespace

std::vector<OptimizerLayer> OptimizerLayers(const std::vector<TensorInfo>& layout, Segment range) {
  return WalkLayers(layout, range, nullptr);
}

std::vector<int64_t> SkippedSteps(const std::vector<TensorInfo>& layout, Segment range, int64_t steps,
                                  std::span<const int64_t> tensor_steps) {
  std::vector<int64_t> skipped;
  if (std::all_of(tensor_steps.begin(), tensor_steps.end(), [&](int64_t n) { return n == steps; })) return skipped;
  std::vector<int> tensors;
  WalkLayers(layout, range, &tensors);
  for (int t : tensors) skipped.push_back(t < 0 ? 0 : steps - tensor_steps[static_cast<size_t>(t)]);
  return skipped;
}

Status TensorSteps(const std::vector<TensorInfo>& layout, Segment range, int64_t steps,
                   std::span<const int64_t> skipped, std::vector<int64_t>* tensor_steps) {
  if (skipped.empty()) return OkStatus();
  std::vector<int> tensors;
  WalkLayers(layout, range, &tensors);
  if (tensors.size() != skipped.size()) {
    return DataLossError("skipped steps for " + std::to_string(skipped.size()) + " layers; the range has " +
                         std::to_string(tensors.size()));
  }
  if (tensor_steps->empty()) tensor_steps->assign(layout.size(), steps);
  for (size_t l = 0; l < tensors.size(); ++l) {
    if (tensors[l] >= 0) (*tensor_steps)[static_cast<size_t>(tensors[l])] = steps - skipped[l];
  }
  return OkStatus();
}

Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  if (!std::isfinite(o.momentum) || o.momentum < 0.0f || o.momentum >= 1.0f) {
    return InvalidArgumentError("momentum must be in [0, 1), got " + std::to_string(o.momentum));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0.0f) {
    return InvalidArgumentError("weight decay must be >= 0, got " + std::to_string(o.weight_decay));
  }
  if (o.kind == OptimizerKind::kSgd) {
    if (o.nesterov && o.momentum == 0.0f) return InvalidArgumentError("nesterov needs momentum > 0");
    return OkStatus();
  }
  if (o.kind == OptimizerKind::kLars) {
    if (o.nesterov) return InvalidArgumentError("nesterov is SGD's; lars has plain momentum");
    if (!(std::isfinite(o.trust_coefficient) && o.trust_coefficient > 0.0)) {
      return InvalidArgumentError("lars trust coefficient must be > 0, got " + std::to_string(o.trust_coefficient));
    }
    return OkStatus();
  }
  const std::string name = OptimizerKindName(o.kind);
  if (o.momentum != 0.0f || o.nesterov) {
    return InvalidArgumentError("momentum and nesterov are SGD's; " + name + " has beta1 instead");
  }
  for (const auto& [beta_name, beta] : {std::pair{"beta1", o.beta1}, std::pair{"beta2", o.beta2}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      return InvalidArgumentError(name + " " + beta_name + " must be in [0, 1), got " + std::to_string(beta));
    }
  }
  if (!(std::isfinite(o.eps) && o.eps > 0.0)) {
    return InvalidArgumentError(name + " eps must be > 0, got " + std::to_string(o.eps));
  }
  return OkStatus();
}

Optimizer::Optimizer(const OptimizerOptions& options, int64_t size) : options_(options) {
  GRADSYNC_CHECK(ValidateOptimizerOptions(options).ok()) << ValidateOptimizerOptions(options);
  GRADSYNC_CHECK(size >= 0);
  size_ = static_cast<size_t>(size);
  num_slots_ = static_cast<int>(OptimizerSlotNames(options_).size());
  state_.assign(static_cast<size_t>(num_slots_) * size_, 0.0f);
  if (size_ > 0) layers_.push_back({0, static_cast<int64_t>(size_), true});
}

void Optimizer::SetLayers(std::vector<OptimizerLayer> layers) {
  int64_t at = 0;
  for (const OptimizerLayer& l : layers) {
    GRADSYNC_CHECK(l.begin == at && l.end > l.begin) << "layer [" << l.begin << ", " << l.end << ") after " << at;
    at = l.end;
  }
  GRADSYNC_CHECK(at == static_cast<int64_t>(size_)) << "layers cover " << at << " of " << size_;
  layers_ = std::move(layers);
  skipped_.clear();
  skip_now_.clear();
  skipping_ = false;
}

void Optimizer::Step(FloatSpan params, ConstFloatSpan grad, float lr, int64_t offset, float grad_scale) {
  GRADSYNC_CHECK(params.size() == grad.size()) << params.size() << " vs " << grad.size();
  const size_t n = grad.size();
  float* w = params.data();
  const float* g = grad.data();
  if (options_.kind == OptimizerKind::kAdam) {
    GRADSYNC_CHECK(offset >= 0 && static_cast<size_t>(offset) + n <= size_)
        << "range " << offset << "+" << n << " outside optimizer state of " << size_;
    if (skipped_.empty()) {
      AdamStep(w, g, n, lr, static_cast<size_t>(offset), grad_scale, steps_ + 1);
      return;
    }
    // Some layer has skipped steps: each layer's piece at its own t.
    ForEachLayerPiece(offset, n, [&](size_t l, size_t skip, size_t len, int64_t at) {
      AdamStep(w + skip, g + skip, len, lr, static_cast<size_t>(at), grad_scale, LayerT(l));
    });
    return;
  }
  if (IsLayerWise(options_.kind)) {
    GRADSYNC_CHECK(offset >= 0 && static_cast<size_t>(offset) + n <= size_)
        << "range " << offset << "+" << n << " outside optimizer state of " << size_;
    ForEachLayerPiece(offset, n, [&](size_t l, size_t skip, size_t len, int64_t at) {
      if (options_.kind == OptimizerKind::kLars) {
        LarsStep(w + skip, g + skip, len, lr, static_cast<size_t>(at), grad_scale, layers_[l].adapt);
      } else {
        LambStep(w + skip, g + skip, len, lr, static_cast<size_t>(at), grad_scale, layers_[l].adapt, LayerT(l));
      }
    });
    return;
  }
  const float wd = options_.weight_decay;
  const float mu = options_.momentum;
  const float gs = grad_scale;
  if (mu == 0.0f) {
    if (wd == 0.0f) {
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (gs * g[i]);
    } else {
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (gs * g[i] + wd * w[i]);
    }
    return;
  }
  GRADSYNC_CHECK(offset >= 0 && static_cast<size_t>(offset) + n <= state_.size())
      << "range " << offset << "+" << n << " outside optimizer state of " << state_.size();
  float* b = state_.data() + offset;
  if (options_.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      float gi = gs * g[i] + wd * w[i];
      b[i] = mu * b[i] + gi;
      w[i] -= lr * (gi + mu * b[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      float gi = gs * g[i] + wd * w[i];
      b[i] = mu * b[i] + gi;
      w[i] -= lr * b[i];
    }
  }
}

// torch.optim.Adam's _single_tensor_adam, each operation in the same precision and order:
//   grad = grad.add(param, alpha=weight_decay)
//   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   step_size = lr / bias_correction1                          (Python floats)
//   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// where a Python scalar meets a float tensor as a float, and 1 - beta is computed in double first.
void Optimizer::AdamStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale,
                         int64_t step) {
  const double t = static_cast<double>(step);
  const double bias1 = 1.0 - std::pow(options_.beta1, t);
  const double bias2 = 1.0 - std::pow(options_.beta2, t);
  const float step_size = static_cast<float>(static_cast<double>(lr) / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float beta1 = static_cast<float>(options_.beta1), beta2 = static_cast<float>(options_.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  const float wd = options_.weight_decay;
  float* m = state_.data() + offset;
  float* v = state_.data() + size_ + offset;
  for (size_t i = 0; i < n; ++i) {
    float gi = grad_scale * g[i];
    if (wd != 0.0f) gi = gi + wd * w[i];
    m[i] = m[i] * beta1 + one_minus_beta1 * gi;
    v[i] = v[i] * beta2 + one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    w[i] = w[i] + (-step_size * m[i]) / denom;
  }
}

// LARS on one layer (or the piece of it this call holds): norms in double, the rest in float.
void Optimizer::LarsStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale, bool adapt) {
  const float wd = adapt ? options_.weight_decay : 0.0f;
  double trust = 1.0;
  if (adapt) {
    const double wn = std::sqrt(SquaredNorm({w, n})), gn = std::fabs(grad_scale) * std::sqrt(SquaredNorm({g, n}));
    if (wn > 0.0 && gn > 0.0) trust = options_.trust_coefficient * wn / (gn + static_cast<double>(wd) * wn);
  }
  const float rate = static_cast<float>(static_cast<double>(lr) * trust);
  const float mu = options_.momentum;
  float* b = state_.data() + offset;
  for (size_t i = 0; i < n; ++i) {
    const float gi = grad_scale * g[i] + wd * w[i];
    b[i] = mu * b[i] + rate * gi;
    w[i] -= b[i];
  }
}

// LAMB on one layer (or the piece of it this call holds). Two passes: m, v and the norms of w
// and r, then the update with r computed again (the same operations, so the same values).
void Optimizer::LambStep(float* w, const float* g, size_t n, float lr, size_t offset, float grad_scale, bool adapt,
                         int64_t step) {
  const double t = static_cast<double>(step);
  const float bias1 = static_cast<float>(1.0 - std::pow(options_.beta1, t));
  const float bias2 = static_cast<float>(1.0 - std::pow(options_.beta2, t));
  const float beta1 = static_cast<float>(options_.beta1), beta2 = static_cast<float>(options_.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  const float wd = adapt ? options_.weight_decay : 0.0f;
  float* m = state_.data() + offset;
  float* v = state_.data() + size_ + offset;
  auto r_of = [&](size_t i) { return (m[i] / bias1) / (std::sqrt(v[i] / bias2) + eps) + wd * w[i]; };
  double ww = 0.0, rr = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float gi = grad_scale * g[i];
    m[i] = m[i] * beta1 + one_minus_beta1 * gi;
    v[i] = v[i] * beta2 + one_minus_beta2 * gi * gi;
    const double wi = w[i], ri = r_of(i);
    ww += wi * wi;
    rr += ri * ri;
  }
  double trust = 1.0;
  if (adapt) {
    const double wn = std::sqrt(ww), rn = std::sqrt(rr);
    if (wn > 0.0 && rn > 0.0) trust = wn / rn;
  }
  const float rate = static_cast<float>(static_cast<double>(lr) * trust);
  for (size_t i = 0; i < n; ++i) w[i] -= rate * r_of(i);
}

void Optimizer::SetState(std::span<const float> state) {
  GRADSYNC_CHECK(state.size() == state_.size()) << state.size() << " vs " << state_.size();
  std::copy(state.begin(), state.end(), state_.begin());
}

void Optimizer::set_steps(int64_t steps) {
  GRADSYNC_CHECK(steps >= 0) << steps;
  steps_ = steps;
}

void Optimizer::SkipLayer(size_t layer) {
  GRADSYNC_CHECK(layer < layers_.size()) << "layer " << layer << " of " << layers_.size();
  if (skip_now_.empty()) skip_now_.assign(layers_.size(), 0);
  skip_now_[layer] = 1;
  skipping_ = true;
}

void Optimizer::EndStep() {
  ++steps_;
  if (!skipping_) return;
  if (skipped_.empty()) skipped_.assign(layers_.size(), 0);
  for (size_t l = 0; l < layers_.size(); ++l) {
    skipped_[l] += skip_now_[l];
    skip_now_[l] = 0;
  }
  skipping_ = false;
}

void Optimizer::set_skipped(std::span<const int64_t> skipped) {
  GRADSYNC_CHECK(CheckSkippedSteps(skipped, layers_.size(), steps_).ok()) << CheckSkippedSteps(skipped, layers_.size(), steps_);
  skipped_.assign(skipped.begin(), skipped.end());
}

Status CheckSkippedSteps(std::span<const int64_t> skipped, size_t layers, int64_t steps) {
  if (skipped.empty()) return OkStatus();
  if (skipped.size() != layers) {
    return InvalidArgumentError("skipped steps for " + std::to_string(skipped.size()) + " layers; the range has " +
                                std::to_string(layers));
  }
  for (size_t l = 0; l < skipped.size(); ++l) {
    if (skipped[l] < 0 || skipped[l] > steps) {
      return InvalidArgumentError("layer " + std::to_string(l) + " skipped " + std::to_string(skipped[l]) +
                                  " steps of " + std::to_string(steps));
    }
  }
  return OkStatus();
}

void Optimizer::StepSparse(FloatSpan params, std::span<const uint64_t> keys,
                           ConstFloatSpan values, float lr, int64_t offset) {
  GRADSYNC_CHECK(keys.size() == values.size()) << keys.size() << " vs " << values.size();
  GRADSYNC_CHECK(options_.kind == OptimizerKind::kSgd) << OptimizerKindName(options_.kind) << " has no sparse step (sparse models are refused with it)";
  const float wd = options_.weight_decay;
  const float mu = options_.momentum;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t k = keys[i];
    GRADSYNC_CHECK(k < params.size()) << "key " << k << " >= " << params.size();
    float gi = values[i] + wd * params[k];
    if (mu == 0.0f) {
      params[k] -= lr * gi;
      continue;
    }
    GRADSYNC_CHECK(static_cast<size_t>(offset) + k < state_.size()) << "key " << k;
    float& b = state_[static_cast<size_t>(offset) + k];
    b = mu * b + gi;
    params[k] -= lr * (options_.nesterov ? gi + mu * b : b);
  }
}

float LrSchedule::At(int64_t step) const {
  if (step < warmup_steps) {
    const double t = static_cast<double>(step) / static_cast<double>(warmup_steps);
    return static_cast<float>(warmup_start + (base - warmup_start) * t);
  }
  if (kind == Kind::kConstant || total_steps <= 0) return base;
  if (step >= total_steps) return base * final_fraction;
  const int64_t warm = std::min(warmup_steps, total_steps - 1);
  double t = static_cast<double>(step - warm) / static_cast<double>(total_steps - warm);
  const double decay = kind == Kind::kLinear ? 1.0 - t : 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  double f = final_fraction + (1.0 - final_fraction) * decay;
  return static_cast<float>(base * f);
}

Result<LrSchedule::Kind> ParseLrScheduleKind(const std::string& text) {
  if (text == "constant") return LrSchedule::Kind::kConstant;
  if (text == "cosine") return LrSchedule::Kind::kCosine;
  if (text == "linear") return LrSchedule::Kind::kLinear;
  return InvalidArgumentError("learning-rate schedule must be constant, cosine or linear, not '" + text + "'");
}

const char* LrScheduleKindName(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::kCosine: return "cosine";
    case LrSchedule::Kind::kLinear: return "linear";
    default: return "constant";
  }
}

}  // namespace gradsync
