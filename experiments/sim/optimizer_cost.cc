#include "experiments/sim/optimizer_cost.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/optim/optimizer.h"

namespace gradsync::sim {
namespace {

// The median time of a few steps of `o` over n floats (after one to warm its state and caches).
double StepUs(const OptimizerOptions& o, int64_t n) {
  std::vector<float> params(static_cast<size_t>(n), 0.01f), grad(static_cast<size_t>(n), 0.001f);
  Optimizer opt(o, n);
  std::vector<double> us;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.Step(params, grad, 0.01f);
    opt.EndStep();
    const auto t1 = std::chrono::steady_clock::now();
    if (i > 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + static_cast<long>(us.size() / 2), us.end());
  return us[us.size() / 2];
}

}  // namespace

Result<double> InnerOptimizerUs(const config::TrainConfig& t, int64_t params) {
  ASSIGN_OR_RETURN(const OptimizerKind kind, ParseOptimizerKind(t.optimizer()));
  OptimizerOptions o;
  o.kind = kind;
  o.weight_decay = t.weight_decay();
  if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kLamb) {
    o.beta1 = t.adam_beta1();
    o.beta2 = t.adam_beta2();
    o.eps = t.adam_eps();
  } else {
    o.momentum = t.momentum();
    o.nesterov = t.nesterov();
  }
  if (kind == OptimizerKind::kLars) o.trust_coefficient = t.trust_coefficient();
  return StepUs(o, std::max<int64_t>(1, params));
}

}  // namespace gradsync::sim
