#include "common/optim/row_optimizer.h"

#include <cmath>

namespace gradsync {

const char* RowOptimizerKindName(RowOptimizerKind kind) {
  switch (kind) {
    case RowOptimizerKind::kSgd:
      return "sgd";
    case RowOptimizerKind::kAdagrad:
      return "adagrad";
    case RowOptimizerKind::kAdam:
      return "adam";
  }
  return "?";
}

Result<RowOptimizerKind> ParseRowOptimizerKind(const std::string& name) {
  for (RowOptimizerKind kind :
       {RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad, RowOptimizerKind::kAdam}) {
    if (name == RowOptimizerKindName(kind)) return kind;
  }
  return InvalidArgumentError("unknown table optimizer '" + name + "' (sgd | adagrad | adam)");
}

Status ValidateRowOptimizerOptions(const RowOptimizerOptions& options) {
  if (!(options.eps > 0.0) || !std::isfinite(options.eps)) {
    return InvalidArgumentError("table optimizer eps must be positive and finite");
  }
  if (!(options.initial_accumulator >= 0.0f) || !std::isfinite(options.initial_accumulator)) {
    return InvalidArgumentError("table optimizer initial accumulator must be >= 0 and finite");
  }
  if (!(options.beta1 >= 0.0 && options.beta1 < 1.0) ||
      !(options.beta2 >= 0.0 && options.beta2 < 1.0)) {
    return InvalidArgumentError("table optimizer betas must lie in [0, 1)");
  }
  return OkStatus();
}

RowOptimizer::RowOptimizer(const RowOptimizerOptions& options, int dim)
    : options_(options),
      dim_(dim),
      state_floats_(options.kind == RowOptimizerKind::kSgd       ? 0
                    : options.kind == RowOptimizerKind::kAdagrad ? 1
                                                                 : 2 * dim),
      beta1_(static_cast<float>(options.beta1)),
      beta2_(static_cast<float>(options.beta2)),
      eps_(static_cast<float>(options.eps)) {}

void RowOptimizer::InitState(float* state) const {
  if (options_.kind == RowOptimizerKind::kAdagrad) {
    state[0] = options_.initial_accumulator;
  } else {
    for (int i = 0; i < state_floats_; ++i) state[i] = 0.0f;
  }
}

void RowOptimizer::Step(float* w, float* state, int64_t* steps, const float* g, float lr,
                        float grad_scale) const {
  const int n = dim_;
  switch (options_.kind) {
    case RowOptimizerKind::kSgd:
      if (grad_scale == 1.0f) {
        for (int j = 0; j < n; ++j) w[j] -= lr * g[j];
      } else {
        for (int j = 0; j < n; ++j) w[j] -= lr * (grad_scale * g[j]);
      }
      return;
    case RowOptimizerKind::kAdagrad: {
      // The mean square in double: a row of large dim sums many terms.
      double sum = 0.0;
      for (int j = 0; j < n; ++j) {
        const float gj = grad_scale * g[j];
        sum += static_cast<double>(gj) * gj;
      }
      state[0] += static_cast<float>(sum / n);
      const float denom = std::sqrt(state[0]) + eps_;
      for (int j = 0; j < n; ++j) w[j] -= lr * (grad_scale * g[j]) / denom;
      return;
    }
    case RowOptimizerKind::kAdam: {
      const int64_t t = ++*steps;
      const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t));
      const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(t));
      const float step_size = static_cast<float>(lr / bias1);
      const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
      float* m = state;
      float* v = state + n;
      for (int j = 0; j < n; ++j) {
        const float gj = grad_scale * g[j];
        m[j] = beta1_ * m[j] + (1.0f - beta1_) * gj;
        v[j] = beta2_ * v[j] + (1.0f - beta2_) * gj * gj;
        w[j] -= step_size * m[j] / (std::sqrt(v[j]) / bias2_sqrt + eps_);
      }
      return;
    }
  }
}

Status RowOptimizer::CheckState(std::span<const float> state, int64_t steps) const {
  if (steps < 0) return InvalidArgumentError("a table row's step count is negative");
  for (size_t i = 0; i < state.size(); ++i) {
    const float x = state[i];
    const bool nonnegative =
        options_.kind == RowOptimizerKind::kAdagrad ||
        (options_.kind == RowOptimizerKind::kAdam && static_cast<int>(i) >= dim_);
    if (!std::isfinite(x) || (nonnegative && x < 0.0f)) {
      return InvalidArgumentError(std::string("table optimizer state value ") + std::to_string(i) +
                                  " (" + std::to_string(x) + ") is not one a " +
                                  RowOptimizerKindName(options_.kind) + " row could hold");
    }
  }
  return OkStatus();
}

}  // namespace gradsync
