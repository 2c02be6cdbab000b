#include "common/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gradsync {

Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  if (!std::isfinite(o.momentum) || o.momentum < 0.0f || o.momentum >= 1.0f) {
    return InvalidArgumentError("momentum must be in [0, 1), got " + std::to_string(o.momentum));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0.0f) {
    return InvalidArgumentError("weight decay must be >= 0, got " + std::to_string(o.weight_decay));
  }
  if (o.nesterov && o.momentum == 0.0f) {
    return InvalidArgumentError("nesterov needs momentum > 0");
  }
  return OkStatus();
}

Optimizer::Optimizer(const OptimizerOptions& options, int64_t size) : options_(options) {
  GRADSYNC_CHECK(ValidateOptimizerOptions(options).ok()) << ValidateOptimizerOptions(options);
  GRADSYNC_CHECK(size >= 0);
  if (options_.momentum > 0.0f) velocity_.assign(static_cast<size_t>(size), 0.0f);
}

void Optimizer::Step(FloatSpan params, ConstFloatSpan grad, float lr, int64_t offset, float grad_scale) {
  GRADSYNC_CHECK(params.size() == grad.size()) << params.size() << " vs " << grad.size();
  const size_t n = grad.size();
  float* w = params.data();
  const float* g = grad.data();
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
  GRADSYNC_CHECK(offset >= 0 && static_cast<size_t>(offset) + n <= velocity_.size())
      << "range " << offset << "+" << n << " outside optimizer state of " << velocity_.size();
  float* b = velocity_.data() + offset;
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

void Optimizer::SetState(std::span<const float> velocity) {
  GRADSYNC_CHECK(velocity.size() == velocity_.size()) << velocity.size() << " vs " << velocity_.size();
  std::copy(velocity.begin(), velocity.end(), velocity_.begin());
}

void Optimizer::StepSparse(FloatSpan params, std::span<const uint64_t> keys,
                           ConstFloatSpan values, float lr, int64_t offset) {
  GRADSYNC_CHECK(keys.size() == values.size()) << keys.size() << " vs " << values.size();
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
    GRADSYNC_CHECK(static_cast<size_t>(offset) + k < velocity_.size()) << "key " << k;
    float& b = velocity_[static_cast<size_t>(offset) + k];
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
  double f = final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  return static_cast<float>(base * f);
}

Result<LrSchedule::Kind> ParseLrScheduleKind(const std::string& text) {
  if (text == "constant") return LrSchedule::Kind::kConstant;
  if (text == "cosine") return LrSchedule::Kind::kCosine;
  return InvalidArgumentError("learning-rate schedule must be constant or cosine, not '" + text + "'");
}

}  // namespace gradsync
