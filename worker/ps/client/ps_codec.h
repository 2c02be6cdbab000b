// PsCodec: the job's codec on a worker (--compress): one gradient encoder per shard (with its
// error-feedback residual or momentum correction), the buffer a push's encoding is built in and,
// with --compress-pull, the decoder of the shards' parameter deltas. No spec: raw values.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/net/transport.h"
#include "compression/gradient_encoder.h"
#include "compression/pull_delta.h"

namespace gradsync {

class PsCodec {
 public:
  // Compresses pushes with `spec` (compression/compressor.h), an encoder of shard_floats[s] values
  // per shard s; with compress_pull, decodes pull deltas. Refused for a sparse `layout`, and
  // error feedback or compress_pull without a codec. On an error there is no codec.
  Status Set(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum, bool compress_pull,
             const std::vector<TensorInfo>& layout, const std::vector<int64_t>& shard_floats);

  // Raw values (no codec): values may go through a value channel.
  bool raw() const { return spec_.empty(); }
  const std::string& spec() const { return spec_; }
  // Pulls ask for deltas (--compress-pull).
  bool compresses_pull() const { return pull_decoder_ != nullptr; }

  // Shard s's dense `runs` of `grads` at `clock`, encoded into *frame (a copy of the encoding).
  Status Encode(int s, std::span<const Segment> runs, ConstFloatSpan grads, int64_t clock, Frame* frame);
  // A pull reply's compressed delta (its values frame `bytes`, over `segments`) added to `target`.
  Status AddPull(std::span<const uint8_t> bytes, std::span<const Segment> segments, int64_t clock, FloatSpan target);

 private:
  std::string spec_;
  std::vector<std::unique_ptr<GradientEncoder>> encoders_;  // per shard
  std::vector<uint8_t> encoded_;
  std::vector<float> gathered_;  // several runs, gathered for the encoder
  std::unique_ptr<PullDeltaDecoder> pull_decoder_;
};

}  // namespace gradsync
