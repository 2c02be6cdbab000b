#include "server/shard/kv/shard_stepper.h"

#include <algorithm>
#include <string>

namespace gradsync {
namespace {
// Adam, LARS and LAMB step a length that does not follow the gradient's scale (Adam, LAMB: m /
// sqrt(v); LARS: the trust ratio divides by ||g||), so a push's g / N would not shorten the step:
// they take g as it is at rate lr / N, weight decay undivided.
bool ScaleFree(const OptimizerOptions& o) { return o.kind != OptimizerKind::kSgd; }

// SGD applies each push as g / N, its weight decay divided by N alike; the others g as it is.
OptimizerOptions PerPushOptions(OptimizerOptions o, int num_workers, bool aggregate) {
  if (!aggregate && !ScaleFree(o)) o.weight_decay /= static_cast<float>(num_workers);
  return o;
}
}  // namespace

ShardStepper::ShardStepper(const OptimizerOptions& options, int num_workers, bool aggregate, int64_t size,
                           std::vector<OptimizerLayer> layers)
    : optimizer_(PerPushOptions(options, num_workers, aggregate), size),
      push_grad_scale_(ScaleFree(options) ? 1.0f : 1.0f / static_cast<float>(num_workers)),
      push_lr_scale_(ScaleFree(options) ? 1.0f / static_cast<float>(num_workers) : 1.0f),
      layer_wise_(IsLayerWise(options.kind)) {
  optimizer_.SetLayers(std::move(layers));
}

void ShardStepper::StepDense(float* params, int64_t local, std::span<const float> g, float lr, float grad_scale,
                             float* clear) {
  auto piece = [&](size_t b, size_t e) {
    optimizer_.Step(std::span<float>(params + local + static_cast<int64_t>(b), e - b), g.subspan(b, e - b), lr,
                    local + static_cast<int64_t>(b), grad_scale);
    if (clear != nullptr) std::fill(clear + b, clear + e, 0.0f);
  };
  // Below a few hundred thousand elements waking threads costs more than it saves.
  constexpr size_t kMinPiece = size_t{1} << 18;
  if (layer_wise_) {
    // LARS, LAMB: a layer's norms are over all of it (its part in this shard), so the run is
    // cut at layer boundaries only, one layer per Step call, the layers spread over the threads.
    if (parallel_ == nullptr || g.size() < 2 * kMinPiece) {
      piece(0, g.size());
      return;
    }
    const int64_t end = local + static_cast<int64_t>(g.size());
    layer_cuts_.clear();
    for (const OptimizerLayer& l : optimizer_.layers()) {
      const int64_t b = std::max(l.begin, local), e = std::min(l.end, end);
      if (b < e) layer_cuts_.push_back({b - local, e - local});
    }
    parallel_->Run(layer_cuts_.size(), 1, [&](size_t first, size_t last) {
      for (size_t i = first; i < last; ++i) {
        piece(static_cast<size_t>(layer_cuts_[i].begin), static_cast<size_t>(layer_cuts_[i].end));
      }
    });
    return;
  }
  if (parallel_ == nullptr) {
    piece(0, g.size());
  } else {
    parallel_->Run(g.size(), kMinPiece, piece);
  }
}

Status ShardStepper::SetState(std::span<const float> state, int64_t steps, std::span<const int64_t> skipped,
                              size_t n) {
  const OptimizerKind kind = optimizer_.options().kind;
  if (state.size() != optimizer_.state().size()) {
    return InvalidArgumentError("an optimizer state of " + std::to_string(state.size()) + " values; this shard's " +
                                OptimizerKindName(kind) + " keeps " + std::to_string(optimizer_.num_slots()) +
                                " vector(s) of " + std::to_string(n));
  }
  if (steps < 0 || steps > (int64_t{1} << 62)) {
    return InvalidArgumentError("optimizer steps " + std::to_string(steps) + " out of range");
  }
  for (int k = 0; k < optimizer_.num_slots(); ++k) {
    RETURN_IF_ERROR(CheckOptimizerSlot(kind, k, state.subspan(static_cast<size_t>(k) * n, n)));
  }
  RETURN_IF_ERROR(CheckSkippedSteps(skipped, optimizer_.layers().size(), steps));
  optimizer_.SetState(state);
  optimizer_.set_steps(steps);
  optimizer_.set_skipped(skipped);
  return OkStatus();
}

}  // namespace gradsync
