#include "server/shard/kv/round_accumulator.h"

#include <algorithm>

namespace gradsync {

RoundAccumulator::RoundAccumulator(bool aggregate, const ShardLayout& layout, size_t size, size_t num_layers) {
  if (!aggregate) return;
  accum_.assign(size, 0.0f);
  if (layout.has_sparse()) touched_.assign(size, 0);
  present_.assign(num_layers, 0);
}

void RoundAccumulator::MarkPresent(const ShardLayout& layout, const std::vector<OptimizerLayer>& layers,
                                   const Segment& s, std::span<const uint32_t> absent) {
  layout.ForPresent(
      s, absent,
      [&](int64_t b, int64_t e, int64_t) {
        auto it = std::upper_bound(layers.begin(), layers.end(), b,
                                   [](int64_t at, const OptimizerLayer& l) { return at < l.begin; });
        for (--it; it != layers.end() && it->begin < e; ++it) present_[static_cast<size_t>(it - layers.begin())] = 1;
      },
      [](size_t) {});
}

void RoundAccumulator::Add(const ShardLayout& layout, const std::vector<OptimizerLayer>& layers,
                           std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                           std::span<const uint32_t> absent) {
  for (const auto& s : segments) {
    layout.ForPresent(
        s, absent,
        [&](int64_t b, int64_t e, int64_t at) {
          float* a = accum_.data() + b;
          const float* v = values + at;
          for (int64_t i = 0; i < e - b; ++i) a[i] += v[i];
        },
        [](size_t) {});
    MarkPresent(layout, layers, s, absent);
    values += s.size();
  }
  const auto begin = static_cast<uint64_t>(layout.range().begin);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t local = keys[i] - begin;
    accum_[local] += values[i];
    if (!touched_[local]) {
      touched_[local] = 1;
      touched_keys_.push_back(local);
    }
  }
}

void RoundAccumulator::ApplyTo(const ShardLayout& layout, ShardStepper& stepper, std::vector<float>& params,
                               float inv, float lr) {
  Optimizer& optimizer = stepper.optimizer();
  const auto& layers = optimizer.layers();
  for (const auto& r : layout.dense_runs()) {
    // The run's layers that the round carries a gradient for, in maximal stretches (all of the
    // run when every push carried every tensor); the others skip the step.
    auto it = std::upper_bound(layers.begin(), layers.end(), r.begin,
                               [](int64_t at, const OptimizerLayer& l) { return at < l.begin; });
    int64_t from = -1;  // start of the present stretch
    for (--it; it != layers.end() && it->begin < r.end; ++it) {
      const size_t l = static_cast<size_t>(it - layers.begin());
      const int64_t b = std::max(r.begin, it->begin), e = std::min(r.end, it->end);
      if (present_[l]) {
        if (from < 0) from = b;
      } else {
        if (from >= 0) {
          float* a = accum_.data() + from;
          stepper.StepDense(params.data(), from, std::span<const float>(a, static_cast<size_t>(b - from)), lr, inv,
                            /*clear=*/a);
          from = -1;
        }
        optimizer.SkipLayer(l);
        std::fill(accum_.data() + b, accum_.data() + e, 0.0f);
      }
    }
    if (from >= 0) {
      float* a = accum_.data() + from;
      stepper.StepDense(params.data(), from, std::span<const float>(a, static_cast<size_t>(r.end - from)), lr, inv,
                        /*clear=*/a);
    }
  }
  std::fill(present_.begin(), present_.end(), 0);
  if (!touched_keys_.empty()) {
    std::sort(touched_keys_.begin(), touched_keys_.end());
    scratch_.resize(touched_keys_.size());
    for (size_t i = 0; i < touched_keys_.size(); ++i) {
      scratch_[i] = accum_[touched_keys_[i]] * inv;
      accum_[touched_keys_[i]] = 0.0f;
      touched_[touched_keys_[i]] = 0;
    }
    optimizer.StepSparse(params, touched_keys_, scratch_, lr);
    touched_keys_.clear();
  }
}

}  // namespace gradsync
