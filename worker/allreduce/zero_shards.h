// ZeroShards: where ZeRO (AllreduceSync, --zero=1|2) cuts the flat parameter vector among the
// ranks: n + 1 offsets, shard r = [bound r, bound r + 1). On the CPU ChunkBegin's n near-equal
// chunks (what the collective's reduce-scatter and all-gather cut); on the device NCCL's n equal
// chunks of the largest multiple of n, the few elements past it (fewer than n) all-reduced and
// updated by every rank. Empty until Cut (no ZeRO).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"

namespace gradsync {

class ZeroShards {
 public:
  // Cuts `params` parameters among `ranks` ranks; this rank is `rank`.
  void Cut(int ranks, int rank, size_t params, bool on_device);

  // This rank's shard.
  size_t begin() const { return bounds_[rank_]; }
  size_t end() const { return bounds_[rank_ + 1]; }
  Segment segment() const { return Segment{static_cast<int64_t>(begin()), static_cast<int64_t>(end())}; }
  // Every shard's bounds (Collective::AllGatherChunks, OverlappedReducer::ReduceScatterToShards).
  const std::vector<size_t>& bounds() const { return bounds_; }
  // On the device: the elements NCCL cuts in equal chunks (the rest, past them, all-reduced).
  size_t device_count() const { return device_count_; }

 private:
  std::vector<size_t> bounds_;
  size_t rank_ = 0;
  size_t device_count_ = 0;
};

}  // namespace gradsync
