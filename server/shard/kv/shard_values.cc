#include "server/shard/kv/shard_values.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace gradsync {

std::vector<float>& ShardValues::Own() {
  // Another holder (a pull reply ZeroMQ is still sending) keeps the old values: they were one
  // version, and stay it.
  if (params_.use_count() > 1) params_ = std::make_shared<std::vector<float>>(*params_);
  return *params_;
}

void ShardValues::Read(std::span<const Segment> segments, std::span<const uint64_t> keys, float* out) const {
  for (const auto& s : segments) {
    const float* src = params_->data() + (s.begin - begin_);
    out = std::copy(src, src + s.size(), out);
  }
  for (uint64_t k : keys) *out++ = (*params_)[k - static_cast<uint64_t>(begin_)];
}

Status ShardValues::Check(std::span<const float> params) const {
  if (params.size() != params_->size()) {
    return InvalidArgumentError("a parameter set of " + std::to_string(params.size()) + " values; this shard holds " +
                                std::to_string(params_->size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!std::isfinite(params[i])) {
      return InvalidArgumentError("parameter " + std::to_string(begin_ + static_cast<int64_t>(i)) +
                                  " of the set is not finite");
    }
  }
  return OkStatus();
}

}  // namespace gradsync
