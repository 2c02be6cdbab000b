#include "common/ps/partitioner.h"

#include <algorithm>

#include "common/base/check.h"

namespace gradsync {

Partitioner::Partitioner(int64_t num_params, int num_shards, int64_t chunk) {
  GRADSYNC_CHECK(num_params >= 0 && num_shards > 0 && chunk > 0);
  // Small models get a finer chunk, so that every shard still holds its share.
  chunk = std::max<int64_t>(1, std::min(chunk, num_params / (4 * static_cast<int64_t>(num_shards))));
  int64_t begin = 0;
  for (int s = 0; s < num_shards; ++s) {
    int64_t end = num_params;
    if (s + 1 < num_shards) {
      // Ideal cut s+1 of num_shards, rounded to the nearest chunk boundary.
      const int64_t ideal = (num_params * (s + 1) + num_shards / 2) / num_shards;
      end = std::clamp((ideal + chunk / 2) / chunk * chunk, begin, num_params);
    }
    ranges_.push_back({begin, end});
    begin = end;
  }
}

int Partitioner::ShardOf(int64_t index) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), index,
                             [](int64_t i, const Segment& r) { return i < r.end; });
  GRADSYNC_CHECK(it != ranges_.end() && index >= it->begin) << "index " << index;
  return static_cast<int>(it - ranges_.begin());
}

std::vector<std::span<const uint64_t>> Partitioner::SplitSortedKeys(std::span<const uint64_t> keys) const {
  std::vector<std::span<const uint64_t>> out;
  size_t pos = 0;
  for (const auto& r : ranges_) {
    size_t end = static_cast<size_t>(
        std::lower_bound(keys.begin() + static_cast<std::ptrdiff_t>(pos), keys.end(),
                         static_cast<uint64_t>(r.end)) - keys.begin());
    out.push_back(keys.subspan(pos, end - pos));
    pos = end;
  }
  return out;
}

std::vector<Segment> DenseRuns(const std::vector<TensorInfo>& layout, const Segment& range) {
  std::vector<Segment> runs;
  for (const auto& t : layout) {
    if (t.sparse) continue;
    int64_t b = std::max(range.begin, t.offset), e = std::min(range.end, t.offset + t.size);
    if (b >= e) continue;
    if (!runs.empty() && runs.back().end == b) runs.back().end = e;
    else runs.push_back({b, e});
  }
  return runs;
}

}  // namespace gradsync
