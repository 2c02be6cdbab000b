#include "worker/allreduce/bucket_average.h"

#include "common/obs/trace.h"

namespace gradsync {

Result<std::unique_ptr<BucketAverager>> BucketAverager::Create(Collective* collective, const std::string& codec,
                                                               uint64_t seed, bool error_feedback,
                                                               float correction_momentum) {
  const std::string spec = codec == "none" ? "" : codec;
  std::unique_ptr<BucketAverager> a(new BucketAverager(collective, spec, seed, error_feedback, correction_momentum));
  if (!spec.empty()) {
    ASSIGN_OR_RETURN(a->decoder_, CreateCompressor(spec, seed));
  }
  return a;
}

Status BucketAverager::Average(FloatSpan g, size_t bucket_index, uint64_t step) {
  if (!decoder_) return collective_->AllReduce(g, ReduceOp::kAverage);
  if (encoders_.size() <= bucket_index) encoders_.resize(bucket_index + 1);
  auto& encoder = encoders_[bucket_index];
  // The first step of this bucket, or a bucket whose size changed (DDP rebuilds its buckets
  // after the first step): a new encoder, whose residual starts at zero.
  if (!encoder || encoder->size() != g.size()) {
    ASSIGN_OR_RETURN(encoder, GradientEncoder::Create(codec_, seed_, g.size(), error_feedback_, correction_momentum_));
    if (allow_overflow_) RETURN_IF_ERROR(encoder->AllowOverflow());
  }
  const bool ring_summable = decoder_->aggregation() == Aggregation::kRingSummable;
  // fp16, bf16: each rank pre-divides by n, so that the ring's sum is the average and stays far
  // from half's range limit (error feedback then keeps its residual in that scale).
  if (ring_summable && !decoder_->sparse()) Scale(g, 1.0f / static_cast<float>(collective_->size()));
  {
    TraceSpan span("encode", "comm", {{"values", static_cast<double>(g.size())}});
    span.CountCpu();
    RETURN_IF_ERROR(encoder->Encode(g, step, &encoded_));
    span.Arg("bytes", static_cast<double>(encoded_.size()));
  }
  if (ring_summable) {
    // The payload is the values themselves, reduced in place inside the ring (the vector's
    // storage is aligned for them): fp16's and bf16's 16-bit values are summed, so 2 bytes per element travel
    // instead of 4; random-k's k values (every rank kept the same indices this step) are
    // averaged, so k floats travel instead of n.
    if (decoder_->sparse()) {
      RETURN_IF_ERROR(collective_->AllReduce(
          FloatSpan(reinterpret_cast<float*>(encoded_.data()), encoded_.size() / sizeof(float)), ReduceOp::kAverage));
    } else {
      RETURN_IF_ERROR(collective_->AllReduce16(
          std::span<uint16_t>(reinterpret_cast<uint16_t*>(encoded_.data()), encoded_.size() / sizeof(uint16_t)),
          *decoder_->float16()));
    }
    TraceSpan span("decode", "comm", {{"bytes", static_cast<double>(encoded_.size())}});
    return decoder_->Decode(encoded_, g.size(), step, g);
  }
  // The others: every rank's payload is all-gathered, decoded and summed in rank order.
  RETURN_IF_ERROR(collective_->AllGather(std::as_bytes(std::span<const uint8_t>(encoded_)), &gathered_));
  decoded_.resize(g.size());
  TraceSpan span("decode", "comm",
                 {{"payloads", static_cast<double>(gathered_.size())}, {"values", static_cast<double>(g.size())}});
  for (size_t r = 0; r < gathered_.size(); ++r) {
    const auto& part = gathered_[r];
    RETURN_IF_ERROR(decoder_->Decode(std::span(reinterpret_cast<const uint8_t*>(part.data()), part.size()), g.size(),
                                     step, r == 0 ? g : FloatSpan(decoded_))
                        .WithContext("payload of rank " + std::to_string(r)));
    if (r > 0) Add(decoded_, g);
  }
  Scale(g, 1.0f / static_cast<float>(gathered_.size()));
  return OkStatus();
}

}  // namespace gradsync
