#include "server/channels/shard_channel.h"

namespace gradsync {

Status CheckDensePush(const PsRequest& r, const KvShard& shard, size_t* n, const char* what) {
  if (r.num_keys > 0 || !r.codec.empty()) {
    return InvalidArgumentError(std::string(what) + " push carries dense raw values only (no keys, no codec)");
  }
  if (r.segments.empty()) return InvalidArgumentError(std::string(what) + " push names no segments");
  if (!Contiguous(r.segments)) return InvalidArgumentError(std::string(what) + " push's segments are not contiguous");
  // In the range, and so in the lane (or no larger than a frame may be).
  return shard.Validate(r.segments, {}, n);
}

Status CheckDensePull(const PsRequest& r, bool has_keys, bool compresses_pulls, const char* what) {
  if (has_keys || !r.codec.empty() || compresses_pulls) {
    return InvalidArgumentError(std::string(what) + " pull asks for dense raw values only (no keys, no codec, " +
                                "and not in a job with --compress-pull)");
  }
  return OkStatus();
}

}  // namespace gradsync
