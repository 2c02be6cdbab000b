// ShardedSampler: which examples worker `rank` of `num_replicas` visits in each epoch.
//
// Like PyTorch's DistributedSampler: every epoch all replicas draw the same seeded permutation
// of 0..n-1 (seed and epoch decide it), and replica r takes positions r, r+N, r+2N, ... So the
// shards are disjoint and together cover the dataset exactly (sizes differ by at most one; no
// padding), and step t of N workers with batch b visits exactly the examples that step t of one
// worker with batch N*b visits: the equivalence bsp and all-reduce tests rely on.
#pragma once

#include <cstdint>
#include <vector>

namespace gradsync {

class ShardedSampler {
 public:
  ShardedSampler(int64_t n, int num_replicas, int rank, uint64_t seed, bool shuffle = true);

  // The indices this replica visits in `epoch`, in visiting order.
  std::vector<uint32_t> EpochIndices(int64_t epoch) const;
  // How many indices EpochIndices returns (the same every epoch).
  int64_t shard_size() const;
  // The smallest shard over all replicas: the number of examples every replica can count on.
  int64_t min_shard_size() const { return n_ / num_replicas_; }

 private:
  int64_t n_;
  int num_replicas_;
  int rank_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace gradsync
