// PushApplier: one worker's push applied to the shard at once (ssp, asp), at the per-push scales
// (ShardStepper). Dense runs step as they come; LARS's and LAMB's, whose trust ratios are per
// layer, are gathered from the push's parts until its last and stepped then, each layer in one
// piece; sparse keys step through the optimizer's sparse update. Holds that gathering and the
// scratch of a push's keys; the counting (version, step) is KvShard's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"
#include "server/shard/kv/shard_layout.h"
#include "server/shard/kv/shard_stepper.h"

namespace gradsync {

class PushApplier {
 public:
  // Applies `values` (dense `segments`, then `keys`) to `params` (the shard's own, ShardValues::Own)
  // at rate `lr` (the push's rate scale included); the tensors in `absent` are left alone and skip
  // the optimizer's step. `last`: the push's last part (LARS, LAMB: the gathered push steps now).
  void Apply(const ShardLayout& layout, ShardStepper& stepper, std::vector<float>& params,
             std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values, float lr,
             bool last, std::span<const uint32_t> absent);

 private:
  std::vector<float> pending_;         // LARS, LAMB: a push's values until its last part
  std::vector<Segment> pending_runs_;  // ... and the local runs they fill
  std::vector<float> scratch_;         // a push's sparse values, scaled
  std::vector<uint64_t> local_keys_;   // a push's keys, local
};

}  // namespace gradsync
