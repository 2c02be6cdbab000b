// ShardValues: the parameters of one shard's range, copy-on-write. A pull reply may send them
// without a copy (Share: it holds them until it lets go); the next update then writes a fresh
// copy (Own), so what the reply sends stays one version. Also the reads of them a pull asks for
// and the check of a parameter set that would replace them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"

namespace gradsync {

class ShardValues {
 public:
  explicit ShardValues(Segment range)
      : begin_(range.begin), params_(std::make_shared<std::vector<float>>(static_cast<size_t>(range.size()), 0.0f)) {}

  std::span<const float> get() const { return *params_; }
  size_t size() const { return params_->size(); }
  // The parameters' owner, for a reply that sends them without a copy (Payload::owner).
  std::shared_ptr<const void> Share() const { return params_; }
  // Before any write: the parameters to this shard alone (a copy if a reply still holds them).
  std::vector<float>& Own();

  // Copies dense `segments` (flat) then the elements at `keys` (flat) to `out`.
  void Read(std::span<const Segment> segments, std::span<const uint64_t> keys, float* out) const;
  // What a parameter set must be: kInvalidArgument naming the first parameter that is not
  // finite, or the size when it is not the range's.
  Status Check(std::span<const float> params) const;

 private:
  int64_t begin_;  // the range's first flat index
  std::shared_ptr<std::vector<float>> params_;
};

}  // namespace gradsync
