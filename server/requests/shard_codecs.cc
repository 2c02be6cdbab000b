#include "server/requests/shard_codecs.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/obs/trace.h"

namespace gradsync {

PushChunk TakeChunk(std::vector<Segment> segments, std::span<const uint64_t> keys, Frame* received,
                    const float* values, size_t n, std::vector<float>* decoded) {
  PushChunk c;
  c.segments = std::move(segments);
  c.keys.assign(keys.begin(), keys.end());
  // A frame's bytes are kept where they are (heap memory that moves with the frame), unless
  // they are few (ZeroMQ keeps a small message's bytes inside the message object, which moves)
  // or not float-aligned: then they are copied.
  constexpr size_t kInlineBytes = 64;
  if (values == received->data() && n * sizeof(float) > kInlineBytes &&
      reinterpret_cast<uintptr_t>(values) % alignof(float) == 0) {
    // The frame is held by the chunk's lease, where its bytes stay.
    auto frame = std::make_shared<Frame>(std::move(*received));
    c.shared = static_cast<const float*>(frame->data());
    c.lease = std::shared_ptr<const float>(frame, c.shared);
  } else if (values == decoded->data() && n > 0) {
    c.owned.swap(*decoded);  // a decoded push: its buffer changes hands
  } else {
    c.owned.resize(std::max<size_t>(n, 1));  // never empty: values() reads owned
    if (n > 0) std::memcpy(c.owned.data(), values, n * sizeof(float));
  }
  return c;
}


Result<ShardCodecs> ShardCodecs::ForJob(const wire::JobConfig& job, Segment range) {
  ShardCodecs c;
  if (!job.compression().empty()) {
    ASSIGN_OR_RETURN(c.codec_, CreateCompressor(job.compression(), job.compression_seed()));
    c.spec_ = job.compression();
  }
  if (job.compress_pull()) {
    if (!c.codec_) return InvalidArgumentError("INIT: compress_pull needs a compression codec");
    ASSIGN_OR_RETURN(std::unique_ptr<Compressor> pull_codec, CreateCompressor(job.compression(), job.compression_seed()));
    c.pull_encoder_ = std::make_unique<PullDeltaEncoder>(std::move(pull_codec), range);
  }
  return c;
}

Result<const float*> ShardCodecs::Decode(const PsRequest& r, const Message& m, size_t n) {
  if (!codec_ || r.codec != spec_) {
    return InvalidArgumentError("push compressed with '" + r.codec + "' but this job uses '" +
                                (spec_.empty() ? std::string("none") : spec_) + "'");
  }
  decoded_.resize(n);
  TraceSpan span("decode", "server", {{"worker", static_cast<double>(r.worker)}, {"bytes", static_cast<double>(m.values.size())}});
  RETURN_IF_ERROR(codec_->Decode(m.values.bytes(), n, static_cast<uint64_t>(r.clock), decoded_));
  return decoded_.data();
}

Status ShardCodecs::CheckPull(const PsRequest& r, bool has_keys) const {
  if (r.codec.empty()) return OkStatus();
  if (!pull_encoder_ || r.codec != spec_) {
    return InvalidArgumentError("pull asks for '" + r.codec + "' deltas but this job " +
                                (pull_encoder_ ? "compresses pulls with '" + spec_ + "'"
                                               : std::string("does not compress pulls (--compress-pull)")));
  }
  if (has_keys) return InvalidArgumentError("a compressed pull carries no keys");
  return OkStatus();
}

Result<bool> ShardCodecs::EncodePull(const PsRequest& r, const KvShard& shard, Frame* frame) {
  // --compress-pull: the delta against what the worker holds, once it holds the whole range.
  const size_t n = static_cast<size_t>(TotalSize(r.segments));
  pull_current_.resize(n);
  shard.Read(r.segments, {}, pull_current_.data());
  TraceSpan encode("encode", "server", {{"worker", static_cast<double>(r.worker)}, {"values", static_cast<double>(n)}});
  encode.CountCpu();
  auto encoded = pull_encoder_->Encode(r.worker, r.segments, pull_current_, r.clock, &pull_payload_);
  encode.End();
  if (!encoded.ok() || !*encoded) return encoded;
  *frame = Frame::Copy(pull_payload_.data(), pull_payload_.size());
  return true;
}

}  // namespace gradsync
