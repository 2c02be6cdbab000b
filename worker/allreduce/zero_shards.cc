#include "worker/allreduce/zero_shards.h"

#include "allreduce/collective.h"

namespace gradsync {

void ZeroShards::Cut(int ranks, int rank, size_t params, bool on_device) {
  const size_t n = static_cast<size_t>(ranks);
  rank_ = static_cast<size_t>(rank);
  bounds_.clear();
  if (on_device) {
    device_count_ = params / n * n;
    for (size_t i = 0; i <= n; ++i) bounds_.push_back(device_count_ / n * i);
  } else {
    for (int i = 0; i <= ranks; ++i) bounds_.push_back(ChunkBegin(params, ranks, i));
  }
}

}  // namespace gradsync
