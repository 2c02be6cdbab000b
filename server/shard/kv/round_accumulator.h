// RoundAccumulator: a bsp round's gradients summed as its pushes come (Add), and their mean
// stepped once when the round is applied (ApplyTo). It keeps the sum, the sparse elements the
// round touched, and which optimizer layers the round carries a gradient for: a dense tensor that
// no push of the round has a gradient for (absent from each, or in none's segments) skips the
// step; the others step on the mean over the round's pushes (an absent push counts as a zero
// gradient there, as an all-reduce's average of workers' unused parameters). Empty in the modes
// without rounds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"
#include "server/shard/kv/shard_layout.h"
#include "server/shard/kv/shard_stepper.h"

namespace gradsync {

class RoundAccumulator {
 public:
  // `aggregate` false: holds nothing (the shard applies pushes at once).
  RoundAccumulator(bool aggregate, const ShardLayout& layout, size_t size, size_t num_layers);

  // Adds a push's `values` (dense `segments`, then `keys`) to the round's sum, but for the
  // tensors in `absent`.
  void Add(const ShardLayout& layout, const std::vector<OptimizerLayer>& layers, std::span<const Segment> segments,
           std::span<const uint64_t> keys, const float* values, std::span<const uint32_t> absent);
  // Steps the sum times `inv` (1 / the round's pushes) into `params` (the shard's own) at rate
  // `lr`, and empties the round (the optimizer's EndStep is the caller's).
  void ApplyTo(const ShardLayout& layout, ShardStepper& stepper, std::vector<float>& params, float inv, float lr);

 private:
  // Marks in present_ the layers segment `s` reaches but for the absent tensors'.
  void MarkPresent(const ShardLayout& layout, const std::vector<OptimizerLayer>& layers, const Segment& s,
                   std::span<const uint32_t> absent);

  std::vector<float> accum_;
  std::vector<uint64_t> touched_keys_;  // local indices of sparse elements touched this round
  std::vector<uint8_t> touched_;
  std::vector<uint8_t> present_;  // per optimizer layer, the round carries a gradient for it
  std::vector<float> scratch_;    // the touched elements' mean
};

}  // namespace gradsync
