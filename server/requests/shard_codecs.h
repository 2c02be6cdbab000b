// ShardCodecs: the job's codecs on one shard: compressed pushes decoded, and (the job's
// compress_pull) pulls answered with compressed deltas against what each worker holds
// (compression/pull_delta.h). Without a codec in the job, pushes and pulls are raw floats and
// this refuses anything that names one. No sockets.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"
#include "compression/compressor.h"
#include "compression/pull_delta.h"
#include "gradsync.pb.h"
#include "server/shard/kv/kv_shard.h"
#include "server/shard/push_assembler.h"

namespace gradsync {

// The values of a validated push message as a chunk that outlives the message (PushChunk): `values` (n
// floats) point into `received` (then its frame is taken when that is safe) or into *decoded
// (then that buffer changes hands), else they are copied.
PushChunk TakeChunk(std::vector<Segment> segments, std::span<const uint64_t> keys, Frame* received,
                    const float* values, size_t n, std::vector<float>* decoded);


class ShardCodecs {
 public:
  ShardCodecs() = default;
  // The codecs of `job` for a shard of `range` (kInvalidArgument: compress_pull without a codec,
  // or a codec that does not parse).
  static Result<ShardCodecs> ForJob(const wire::JobConfig& job, Segment range);

  // A compressed push's values (its `segments` hold n floats), decoded (and so validated) into a
  // buffer this keeps until the next decode or until a chunk takes it (decoded()).
  Result<const float*> Decode(const PsRequest& r, const Message& m, size_t n);
  std::vector<float>* decoded() { return &decoded_; }

  bool compresses_pulls() const { return pull_encoder_ != nullptr; }
  // A pull that asks for deltas (`r.codec`): this job's codec, no keys.
  Status CheckPull(const PsRequest& r, bool has_keys) const;
  // The delta of a pull that asks for one, into `frame`, read from `shard`; false: answer it raw
  // (the worker does not hold the whole range yet); an error: answer it raw too.
  Result<bool> EncodePull(const PsRequest& r, const KvShard& shard, Frame* frame);
  // A raw answer's values, which the worker now holds (the base of its next delta).
  void Sent(const PsRequest& r, const float* values) {
    if (pull_encoder_) pull_encoder_->Record(r.worker, r.segments, values);
  }
  // A rejoined worker's first pull is raw.
  void Forget(int worker) {
    if (pull_encoder_) pull_encoder_->Forget(worker);
  }
  const std::string& spec() const { return spec_; }

 private:
  std::string spec_;  // the job's push codec ("" = raw floats)
  std::unique_ptr<Compressor> codec_;
  std::unique_ptr<PullDeltaEncoder> pull_encoder_;
  std::vector<float> decoded_, pull_current_;
  std::vector<uint8_t> pull_payload_;
};

}  // namespace gradsync
