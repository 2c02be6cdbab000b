#include "server/shard/kv/shard_layout.h"

#include <string>

#include "common/ps/partitioner.h"

namespace gradsync {

ShardLayout::ShardLayout(Segment range, std::vector<TensorInfo> layout, const std::vector<OptimizerLayer>& layers)
    : range_(range), layout_(std::move(layout)) {
  for (const auto& r : DenseRuns(layout_, range_)) dense_runs_.push_back({r.begin - range_.begin, r.end - range_.begin});
  for (const auto& t : layout_) {
    if (!t.sparse) continue;
    int64_t b = std::max(range_.begin, t.offset), e = std::min(range_.end, t.offset + t.size);
    if (b < e) sparse_runs_.push_back({b - range_.begin, e - range_.begin});
  }
  std::sort(sparse_runs_.begin(), sparse_runs_.end(), [](const Segment& x, const Segment& y) { return x.begin < y.begin; });
  for (const TensorInfo& t : layout_) {
    const auto [b, e] = Overlap(t, range_);
    if (b >= e) {
      tensor_local_.push_back({0, 0});
      tensor_layer_.push_back(-1);
      continue;
    }
    tensor_local_.push_back({b - range_.begin, e - range_.begin});
    auto it = std::lower_bound(layers.begin(), layers.end(), b - range_.begin,
                               [](const OptimizerLayer& l, int64_t at) { return l.begin < at; });
    tensor_layer_.push_back(it != layers.end() && it->begin == b - range_.begin ? static_cast<int>(it - layers.begin()) : -1);
  }
}

Status ShardLayout::ValidateAbsent(std::span<const Segment> segments, std::span<const uint32_t> absent) const {
  for (size_t i = 0; i < absent.size(); ++i) {
    const uint32_t t = absent[i];
    if (t >= layout_.size()) {
      return InvalidArgumentError("absent tensor " + std::to_string(t) + " of a layout of " + std::to_string(layout_.size()));
    }
    if (i > 0 && t <= absent[i - 1]) return InvalidArgumentError("absent tensors are not increasing");
    if (layout_[t].sparse) return InvalidArgumentError("absent tensor " + std::to_string(t) + " is sparse (its keys say what it has)");
    const Segment& local = tensor_local_[t];
    const bool reached = std::any_of(segments.begin(), segments.end(), [&](const Segment& s) {
      return local.begin < local.end && s.begin - range_.begin < local.end && local.begin < s.end - range_.begin;
    });
    if (!reached) {
      return InvalidArgumentError("absent tensor " + std::to_string(t) + " ('" + layout_[t].name +
                                  "') is not in the push's segments");
    }
  }
  return OkStatus();
}

Status ShardLayout::Validate(std::span<const Segment> segments, std::span<const uint64_t> keys,
                         const size_t* num_values) const {
  uint64_t total = keys.size();
  int64_t previous_end = range_.begin;
  for (const auto& s : segments) {
    if (s.end < s.begin || s.begin < range_.begin || s.end > range_.end) {
      return InvalidArgumentError("segment [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                                  ") is outside this shard's range [" + std::to_string(range_.begin) + ", " +
                                  std::to_string(range_.end) + ")");
    }
    // Sorted and disjoint (as every sender cuts them): so a request addresses at most the
    // shard's range, and a small header cannot ask for a reply many times the shard's size.
    if (s.begin < previous_end) {
      return InvalidArgumentError("segment [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                                  ") overlaps or precedes the one before it (segments must be sorted and disjoint)");
    }
    previous_end = s.end;
    total += static_cast<uint64_t>(s.size());
  }
  if (!KeysValid(keys)) {
    // Something is wrong: the first bad key, named.
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t k = keys[i];
      if (k < static_cast<uint64_t>(range_.begin) || k >= static_cast<uint64_t>(range_.end)) {
        return InvalidArgumentError("key " + std::to_string(k) + " is outside this shard's range");
      }
      if (i > 0 && k <= keys[i - 1]) return InvalidArgumentError("keys are not sorted and unique");
      const int64_t local = static_cast<int64_t>(k) - range_.begin;
      bool sparse = std::any_of(sparse_runs_.begin(), sparse_runs_.end(),
                                [&](const Segment& r) { return local >= r.begin && local < r.end; });
      if (!sparse) return InvalidArgumentError("key " + std::to_string(k) + " is not in a sparse tensor");
    }
    return InternalError("keys refused, but no key is wrong");  // unreachable: KeysValid and this loop agree
  }
  if (num_values && *num_values != total) {
    return InvalidArgumentError("request addresses " + std::to_string(total) + " values but carries " +
                                std::to_string(*num_values));
  }
  return OkStatus();
}

bool ShardLayout::KeysValid(std::span<const uint64_t> keys) const {
  // Sorted and unique: one branch-free pass (the common case is a valid request).
  bool descending = false;
  for (size_t i = 1; i < keys.size(); ++i) descending |= keys[i] <= keys[i - 1];
  if (descending) return false;
  // Sorted keys lie in the sparse runs (sorted, disjoint, inside the range) when none falls
  // before a run or between two: per run, the keys below its end must start at or after its begin.
  size_t pos = 0;
  for (const Segment& r : sparse_runs_) {
    const auto begin = static_cast<uint64_t>(range_.begin + r.begin), end = static_cast<uint64_t>(range_.begin + r.end);
    if (pos < keys.size() && keys[pos] < begin) return false;
    pos = static_cast<size_t>(std::lower_bound(keys.begin() + static_cast<std::ptrdiff_t>(pos), keys.end(), end) -
                              keys.begin());
  }
  return pos == keys.size();
}

}  // namespace gradsync
