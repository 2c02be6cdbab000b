#include "worker/ps/client/ps_codec.h"

#include "common/obs/trace.h"
#include "compression/compressor.h"

namespace gradsync {

Status PsCodec::Set(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum,
                    bool compress_pull, const std::vector<TensorInfo>& layout, const std::vector<int64_t>& shard_floats) {
  encoders_.clear();
  spec_.clear();
  encoded_.clear();
  pull_decoder_.reset();
  ASSIGN_OR_RETURN(auto probe, CreateCompressor(spec, seed));
  if (!probe) {
    if (error_feedback) return InvalidArgumentError("--error-feedback needs a --compress codec");
    if (compress_pull) return InvalidArgumentError("--compress-pull needs a --compress codec");
    return OkStatus();
  }
  for (const auto& t : layout) {
    if (t.sparse) return InvalidArgumentError("--compress applies to dense models; " + t.name + " is sparse");
  }
  for (int64_t floats : shard_floats) {
    auto e = GradientEncoder::Create(spec, seed, static_cast<size_t>(floats), error_feedback, correction_momentum);
    if (!e.ok()) {
      encoders_.clear();
      return e.status();
    }
    encoders_.push_back(std::move(e).value());
  }
  spec_ = spec;
  if (compress_pull) {
    ASSIGN_OR_RETURN(auto codec, CreateCompressor(spec, seed));  // as the server's (job.compress_pull)
    pull_decoder_ = std::make_unique<PullDeltaDecoder>(std::move(codec));
  }
  return OkStatus();
}

Status PsCodec::Encode(int s, std::span<const Segment> runs, ConstFloatSpan grads, int64_t clock, Frame* frame) {
  // The shard's dense values, encoded (the codec sees one vector per shard and step).
  ConstFloatSpan dense;
  if (runs.size() == 1) {
    dense = grads.subspan(static_cast<size_t>(runs[0].begin), static_cast<size_t>(runs[0].size()));
  } else {
    gathered_.clear();
    for (const auto& run : runs) gathered_.insert(gathered_.end(), grads.begin() + run.begin, grads.begin() + run.end);
    dense = gathered_;
  }
  TraceSpan encode("encode", "comm", {{"shard", static_cast<double>(s)}, {"values", static_cast<double>(dense.size())}});
  encode.CountCpu();
  RETURN_IF_ERROR(encoders_[static_cast<size_t>(s)]->Encode(dense, static_cast<uint64_t>(clock), &encoded_));
  encode.Arg("bytes", static_cast<double>(encoded_.size()));
  *frame = Frame::Copy(encoded_.data(), encoded_.size());
  return OkStatus();
}

Status PsCodec::AddPull(std::span<const uint8_t> bytes, std::span<const Segment> segments, int64_t clock,
                        FloatSpan target) {
  return pull_decoder_->AddTo(bytes, segments, clock, target);
}

}  // namespace gradsync
