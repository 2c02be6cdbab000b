#include "server/shard/kv/push_applier.h"

#include <algorithm>

#include "common/base/check.h"

namespace gradsync {

void PushApplier::Apply(const ShardLayout& layout, ShardStepper& stepper, std::vector<float>& params,
                        std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                        float lr, bool last, std::span<const uint32_t> absent) {
  Optimizer& optimizer = stepper.optimizer();
  const float grad_scale = stepper.push_grad_scale();
  auto skip = [&](size_t layer) { optimizer.SkipLayer(layer); };
  if (stepper.layer_wise()) {
    // LARS, LAMB: a push's parts may cut a layer, so its dense values are gathered until its
    // last part and applied then, each layer in one piece (dense models only: no keys).
    GRADSYNC_CHECK(keys.empty()) << OptimizerKindName(optimizer.options().kind) << " takes dense pushes only";
    if (pending_.size() != params.size()) pending_.assign(params.size(), 0.0f);
    for (const auto& s : segments) {
      layout.ForPresent(
          s, absent,
          [&](int64_t b, int64_t e, int64_t at) {
            std::copy(values + at, values + at + (e - b), pending_.data() + b);
            pending_runs_.push_back({b, e});
          },
          skip);
      values += s.size();
    }
    if (!last) return;
    std::sort(pending_runs_.begin(), pending_runs_.end(), [](const Segment& x, const Segment& y) { return x.begin < y.begin; });
    size_t i = 0;
    while (i < pending_runs_.size()) {
      Segment run = pending_runs_[i++];
      while (i < pending_runs_.size() && pending_runs_[i].begin == run.end) run.end = pending_runs_[i++].end;
      stepper.StepDense(params.data(), run.begin,
                        std::span<const float>(pending_.data() + run.begin, static_cast<size_t>(run.size())), lr,
                        grad_scale, nullptr);
    }
    pending_runs_.clear();
  }
  for (const auto& s : stepper.layer_wise() ? std::span<const Segment>() : segments) {
    layout.ForPresent(
        s, absent,
        [&](int64_t b, int64_t e, int64_t at) {
          stepper.StepDense(params.data(), b, std::span<const float>(values + at, static_cast<size_t>(e - b)), lr,
                            grad_scale, nullptr);
        },
        skip);
    values += s.size();
  }
  if (!keys.empty()) {
    const auto begin = static_cast<uint64_t>(layout.range().begin);
    local_keys_.resize(keys.size());
    scratch_.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      local_keys_[i] = keys[i] - begin;
      scratch_[i] = values[i] * grad_scale;
    }
    optimizer.StepSparse(params, local_keys_, scratch_, lr);
  }
}

}  // namespace gradsync
