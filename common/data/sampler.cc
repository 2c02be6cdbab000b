#include "common/data/sampler.h"

#include "common/base/check.h"
#include "common/base/numeric/rng.h"

namespace gradsync {

ShardedSampler::ShardedSampler(int64_t n, int num_replicas, int rank, uint64_t seed, bool shuffle)
    : n_(n), num_replicas_(num_replicas), rank_(rank), seed_(seed), shuffle_(shuffle) {
  GRADSYNC_CHECK(n >= 0 && n <= UINT32_MAX) << n;
  GRADSYNC_CHECK(num_replicas > 0 && rank >= 0 && rank < num_replicas) << rank << "/" << num_replicas;
}

int64_t ShardedSampler::shard_size() const {
  return n_ / num_replicas_ + (rank_ < n_ % num_replicas_ ? 1 : 0);
}

std::vector<uint32_t> ShardedSampler::EpochIndices(int64_t epoch) const {
  std::vector<uint32_t> order;
  if (shuffle_) {
    Rng rng(Rng::Derive(seed_, kDataStream, static_cast<uint64_t>(epoch)));
    order = rng.Permutation(static_cast<uint32_t>(n_));
  } else {
    order.resize(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order[i] = static_cast<uint32_t>(i);
  }
  if (num_replicas_ == 1) return order;
  std::vector<uint32_t> mine;
  mine.reserve(static_cast<size_t>(shard_size()));
  for (int64_t i = rank_; i < n_; i += num_replicas_) mine.push_back(order[i]);
  return mine;
}

}  // namespace gradsync
