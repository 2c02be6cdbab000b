#include "experiments/sim/codec_costs.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <utility>

#include "common/base/numeric/blas_threads.h"
#include "common/base/numeric/rng.h"
#include "common/base/numeric/segment.h"
#include "common/base/numeric/tensor.h"
#include "common/config/train_config.h"
#include "common/obs/metrics.h"
#include "compression/compressor.h"
#include "compression/powersgd.h"
#include "compression/gradient_encoder.h"
#include "compression/pull_delta.h"

namespace gradsync::sim {

Codecs::Codecs(std::string spec, bool error_feedback, float correction, double encode_us_per_float,
               double pull_encode_us_per_float, double gather_decode_us_per_float)
    : spec_(std::move(spec)),
      error_feedback_(error_feedback),
      correction_(correction),
      encode_per_float_(encode_us_per_float),
      pull_encode_per_float_(pull_encode_us_per_float),
      gather_decode_per_float_(gather_decode_us_per_float) {}

Result<double> Codecs::GatherDecodeUs(size_t n, int payloads, double apply_ns_per_byte) {
  if (gather_decode_per_float_ >= 0) return gather_decode_per_float_ * static_cast<double>(n) * payloads;
  ASSIGN_OR_RETURN(CodecCost c, Cost(n));
  return (c.decode_us + apply_ns_per_byte * 4 * static_cast<double>(n) / 1e3) * (payloads - 1);
}

Result<CodecCost> Codecs::Cost(size_t n) {
  if (auto it = cache_.find(n); it != cache_.end()) return it->second;
  // The sender's own encoder (error feedback or momentum correction as the run has them), and
  // the codec's decode.
  ASSIGN_OR_RETURN(auto encoder, GradientEncoder::Create(spec_, 1, n, error_feedback_, correction_));
  ASSIGN_OR_RETURN(auto codec, CreateCompressor(spec_, 1));
  std::vector<float> x(n), out(n);
  Rng rng(n);
  for (auto& v : x) v = rng.Uniform(-1, 1);
  std::vector<uint8_t> payload;
  std::vector<double> enc, dec;
  for (int i = 0; i < 7; ++i) {
    Evict();
    auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(encoder->Encode(x, static_cast<uint64_t>(i), &payload));
    auto t1 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(codec->Decode(payload, n, static_cast<uint64_t>(i), out));
    auto t2 = std::chrono::steady_clock::now();
    if (i < 2) continue;  // warming up: buffers allocated, residual filled, as in a running worker
    enc.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    dec.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  // A compressed pull: the shard's PullDeltaEncoder against its mirror of the worker, and the
  // worker's PullDeltaDecoder adding the delta to its parameters.
  ASSIGN_OR_RETURN(auto mirror_codec, CreateCompressor(spec_, 1));
  ASSIGN_OR_RETURN(auto worker_codec, CreateCompressor(spec_, 1));
  const Segment range{0, static_cast<int64_t>(n)};
  PullDeltaEncoder shard(std::move(mirror_codec), range);
  PullDeltaDecoder worker(std::move(worker_codec));
  shard.Record(0, std::span(&range, 1), out.data());
  std::vector<double> penc, pdec;
  for (int i = 0; i < 7; ++i) {
    for (auto& v : x) v += 1e-3f;
    Evict();
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(bool encoded, shard.Encode(0, std::span(&range, 1), x, i, &payload));
    auto t1 = std::chrono::steady_clock::now();
    if (!encoded) return InternalError("the pull delta encoder refused a complete mirror");
    RETURN_IF_ERROR(worker.AddTo(payload, std::span(&range, 1), i, out));
    auto t2 = std::chrono::steady_clock::now();
    if (i < 2) continue;
    penc.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    pdec.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  CodecCost c{payload.size(), Median(std::move(enc)), Median(std::move(dec)), Median(std::move(penc)),
              Median(std::move(pdec))};
  // A real run's spans, when given, instead of the encoders timed here.
  if (encode_per_float_ >= 0) c.encode_us = encode_per_float_ * static_cast<double>(n);
  if (pull_encode_per_float_ >= 0) c.pull_encode_us = pull_encode_per_float_ * static_cast<double>(n);
  cache_[n] = c;
  return c;
}

bool Codecs::factored() const {
  const auto spec = ParseCodecSpec(spec_);
  return spec.ok() && !spec->payload();
}

Result<LowRankCost> Codecs::LowRank(const std::vector<std::vector<int64_t>>& shapes, int blas_threads) {
  if (low_rank_) return *low_rank_;
  // The worker's own OpenBLAS threads (--threads): on small factors a second thread costs more
  // than it gives.
  SetBlasThreads(blas_threads);
  ASSIGN_OR_RETURN(const CodecSpec spec, ParseCodecSpec(spec_));
  if (spec.payload()) return InvalidArgumentError("compress '" + spec_ + "' is not a low-rank codec");
  const std::vector<TensorInfo> layout = PackedLayout(shapes);
  PowerSgd power(layout, static_cast<int>(spec.param), /*seed=*/1, error_feedback_);
  std::vector<float> grads(static_cast<size_t>(LayoutSize(layout))), first(power.first_floats()), second(power.second_floats());
  Rng rng(grads.size());
  std::vector<double> t_first, t_second, t_finish;
  // Warm, unlike the payload codecs: the three passes run back to back on the gradient backward
  // has just written and on the worker's own factors and residual, with only two small
  // all-reduces between them (timed from cold caches they took 3-5x what the real runs'
  // steps leave for them: docs/simulator.md, "not fitted on").
  for (int i = 0; i < 7; ++i) {
    for (auto& v : grads) v = rng.Uniform(-1, 1);
    auto t0 = std::chrono::steady_clock::now();
    power.First(grads, first);
    auto t1 = std::chrono::steady_clock::now();
    power.Second(first, second);
    auto t2 = std::chrono::steady_clock::now();
    power.Finish(first, second, grads);
    auto t3 = std::chrono::steady_clock::now();
    if (i < 2) continue;  // warming up: Q's warm start and the residual, as in a running worker
    t_first.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    t_second.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    t_finish.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
  }
  low_rank_ = LowRankCost{power.first_floats(), power.second_floats(), Median(std::move(t_first)),
                          Median(std::move(t_second)), Median(std::move(t_finish))};
  return *low_rank_;
}

std::string Codecs::Describe() const {
  std::ostringstream o;
  if (low_rank_) {
    const LowRankCost& c = *low_rank_;
    o << spec_ << (error_feedback_ ? "+ef" : "") << ": " << c.first_floats << " + " << c.second_floats
      << " floats a step, its passes " << std::lround(c.first_us) << " / " << std::lround(c.second_us) << " / "
      << std::lround(c.finish_us) << " us";
  }
  for (const auto& [n, c] : cache_) {
    o << (o.tellp() > 0 ? "; " : "") << spec_ << (error_feedback_ ? "+ef" : "") << " of " << n
      << " floats: " << c.payload << " B, encode " << std::lround(c.encode_us) << " us, decode "
      << std::lround(c.decode_us) << " us, pull delta " << std::lround(c.pull_encode_us) << " / "
      << std::lround(c.pull_decode_us) << " us";
  }
  return o.str();
}

bool Codecs::summable() {
  auto codec = CreateCompressor(spec_, 1);
  return codec.ok() && (*codec)->aggregation() == Aggregation::kRingSummable;
}

size_t Codecs::summed_element_bytes() {
  auto codec = CreateCompressor(spec_, 1);
  return codec.ok() && (*codec)->sparse() ? sizeof(float) : sizeof(uint16_t);
}

void Codecs::Evict() {
  evict_.resize(16u << 20);
  float sum = 0;
  for (size_t i = 0; i < evict_.size(); i += 16) sum += (evict_[i] += 1.0f);
  sink_ = sink_ + sum;
}

}  // namespace gradsync::sim
