// ShardLayout: where a request's data lies in one shard. The shard's range of the flat parameter
// space and the job's tensors cut to it: its dense runs, its sparse runs, each tensor's local part
// and optimizer layer; and the checks of what a request addresses (its segments, keys and absent
// tensors) against them. Holds no values: KvShard's parts read and write those through it.
//
// Offsets called local are relative to range().begin.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/optim/optimizer.h"

namespace gradsync {

class ShardLayout {
 public:
  // `layers`: the optimizer's layers over the range (OptimizerLayers), local.
  ShardLayout(Segment range, std::vector<TensorInfo> layout, const std::vector<OptimizerLayer>& layers);

  const Segment& range() const { return range_; }
  // The dense runs of the range, local.
  const std::vector<Segment>& dense_runs() const { return dense_runs_; }
  bool has_sparse() const { return !sparse_runs_.empty(); }

  // Checks that segments lie in the range and keys are sorted, unique, in range and sparse;
  // `values` (if not null) must hold exactly segment lengths + keys values.
  Status Validate(std::span<const Segment> segments, std::span<const uint64_t> keys,
                  const size_t* num_values) const;
  // Checks a push's absent tensors (PsRequest::absent_tensors): layout indices, increasing, of
  // dense tensors that its `segments` reach.
  Status ValidateAbsent(std::span<const Segment> segments, std::span<const uint32_t> absent) const;

  // fn(local begin, local end, position in the segment's values) for each run of segment `s`
  // outside the absent tensors; skip(layer) for each absent tensor's layer it reaches.
  template <typename Fn, typename Skip>
  void ForPresent(const Segment& s, std::span<const uint32_t> absent, Fn&& fn, Skip&& skip) const {
    const int64_t lb = s.begin - range_.begin, le = s.end - range_.begin;
    if (absent.empty()) {
      if (lb < le) fn(lb, le, int64_t{0});
      return;
    }
    std::vector<std::pair<Segment, int>> cut;  // the absent tensors' local ranges inside s, and their layers
    for (uint32_t t : absent) {
      const Segment& local = tensor_local_[t];
      const int64_t b = std::max(lb, local.begin), e = std::min(le, local.end);
      if (b < e) cut.push_back({{b, e}, tensor_layer_[t]});
    }
    std::sort(cut.begin(), cut.end(), [](const auto& x, const auto& y) { return x.first.begin < y.first.begin; });
    int64_t at = lb;
    for (const auto& [range, layer] : cut) {
      if (range.begin > at) fn(at, range.begin, at - lb);
      if (layer >= 0) skip(static_cast<size_t>(layer));
      at = std::max(at, range.end);
    }
    if (at < le) fn(at, le, at - lb);
  }

 private:
  // Whether sorted, unique keys of sparse elements of the range (the fast check; Validate names
  // the first bad key when it fails).
  bool KeysValid(std::span<const uint64_t> keys) const;

  Segment range_;
  std::vector<TensorInfo> layout_;
  std::vector<Segment> dense_runs_;    // local
  std::vector<Segment> sparse_runs_;   // local, sorted
  std::vector<Segment> tensor_local_;  // per layout tensor: its part of the range, local (empty: none)
  std::vector<int> tensor_layer_;      // per layout tensor: its optimizer layer (-1: none in the range)
};

}  // namespace gradsync
