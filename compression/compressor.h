// Gradient compression: a Compressor turns a float vector into the exact bytes that go on the
// wire, and back.
//
//   ASSIGN_OR_RETURN(auto c, CreateCompressor("topk:0.01", seed));
//   std::vector<uint8_t> payload;
//   c->Encode(grad, step, &payload);                  // payload.size() == c->PayloadBytes(n)
//   RETURN_IF_ERROR(c->Decode(payload, n, step, out)); // out: the dense decoded vector
//
// Decode validates the payload (length, index range and order, level range, finite scales) and
// returns kDataLoss for a bad one without reading out of bounds. How payloads may be combined:
// kRingSummable codecs (fp16, random-k with a step-shared index set) decode linearly with
// parameters every rank shares, so their payloads can be summed inside a ring; kGatherOnly codecs
// (top-k, int8, qsgd, sign: per-worker indices or scales) are combined by all-gather or on a
// server. Error feedback is a separate wrapper (error_feedback.h). Codecs are stateless apart
// from scratch buffers: one instance per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/half.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"

namespace gradsync {

enum class Aggregation { kRingSummable, kGatherOnly };

class Compressor {
 public:
  virtual ~Compressor() = default;

  virtual std::string name() const = 0;
  virtual Aggregation aggregation() const = 0;
  // True when the decoded vector is zero outside a subset of indices (top-k, random-k).
  virtual bool sparse() const { return false; }
  // The 16-bit format of a codec whose payload is the elements as 16-bit floats (fp16, bf16):
  // the ring sums those in place.
  virtual std::optional<Float16> float16() const { return std::nullopt; }

  // Encodes x into *out (replaced). `step` seeds any randomness (QSGD's stochastic rounding,
  // random-k's index set, which every rank draws identically for the same step).
  virtual void Encode(ConstFloatSpan x, uint64_t step, std::vector<uint8_t>* out) = 0;
  // Decodes a payload for n elements into out (n floats, overwritten).
  virtual Status Decode(std::span<const uint8_t> payload, size_t n, uint64_t step, FloatSpan out) const = 0;
  // The payload size for n elements: the formula tests and the wire accounting rely on.
  virtual size_t PayloadBytes(size_t n) const = 0;
};

// "none" is not a codec: CreateCompressor("none") returns a null pointer.
// Specs: fp16 | bf16 | int8 | qsgd:LEVELS | sign | topk:RATIO | randomk:RATIO (0 < RATIO <= 1).
// `unbiased_randomk` scales random-k by n/k (use it when there is no error feedback).
Result<std::unique_ptr<Compressor>> CreateCompressor(const std::string& spec, uint64_t seed,
                                                     bool unbiased_randomk = false);

// The codec step of a compressed pull reply for a worker's iteration `clock`: apart from the
// push steps, so that random-k draws other indices for the parameters than for the gradients.
inline uint64_t PullCodecStep(int64_t clock) { return static_cast<uint64_t>(clock) | (uint64_t{1} << 63); }

// Elements kept by a sparsifier with this ratio: max(1, round(ratio * n)), at most n (0 for n = 0).
size_t KeptElements(size_t n, double ratio);

// Little-endian payload helpers shared by the codecs.
namespace payload {
void PutU32(std::vector<uint8_t>* out, uint32_t v);
void PutF32(std::vector<uint8_t>* out, float v);
uint32_t GetU32(const uint8_t* p);
float GetF32(const uint8_t* p);
}  // namespace payload

}  // namespace gradsync
