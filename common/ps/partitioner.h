// Partitioner: which server shard owns which part of the flat parameter space.
//
// The model's tensors are laid out in one flat buffer of `num_params` floats (TensorInfo
// offsets). It is cut into `num_shards` contiguous ranges of near-equal size (balanced by bytes,
// within one chunk: cut points are rounded to multiples of `chunk` elements, a chunk being at
// most a quarter of a shard's share for small models), so a large tensor
// spreads over several shards and a shard may hold several small tensors. Every element belongs
// to exactly one shard. Sparse tensors (2^20+ hashed keys) are partitioned the same way, i.e. by
// key range. Both the servers and the PS client use this, so it lives in common/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/numeric/tensor.h"

namespace gradsync {

class Partitioner {
 public:
  static constexpr int64_t kDefaultChunk = 1024;

  Partitioner(int64_t num_params, int num_shards, int64_t chunk = kDefaultChunk);

  int num_shards() const { return static_cast<int>(ranges_.size()); }
  const Segment& range(int shard) const { return ranges_[shard]; }
  const std::vector<Segment>& ranges() const { return ranges_; }
  // The shard that owns flat element `index` (0 <= index < num_params).
  int ShardOf(int64_t index) const;
  // Splits sorted keys into per-shard subspans (keys must be sorted ascending).
  std::vector<std::span<const uint64_t>> SplitSortedKeys(std::span<const uint64_t> keys) const;

 private:
  std::vector<Segment> ranges_;
};

// The parts of [range) that are dense tensors (not sparse), as flat [begin, end) runs.
std::vector<Segment> DenseRuns(const std::vector<TensorInfo>& layout, const Segment& range);

}  // namespace gradsync
