// GradientEncoder: the sending side of one gradient vector's compression, chosen once: the codec
// alone (random-k then unbiased, scaled by n/k), with an error-feedback residual
// (error_feedback.h), or with DGC momentum correction (momentum_correction.h, sparsifying codecs
// only). The PS client keeps one per shard, the all-reduce trainer one per bucket.
//
//   ASSIGN_OR_RETURN(auto enc, GradientEncoder::Create("topk:0.01", seed, n, /*error_feedback=*/true, 0));
//   RETURN_IF_ERROR(enc->Encode(grad, step, &payload));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compression/compressor.h"
#include "compression/error_feedback.h"
#include "compression/momentum_correction.h"

namespace gradsync {

class GradientEncoder {
 public:
  // Fails for "none" (no codec) and for momentum correction with a codec that does not sparsify.
  static Result<std::unique_ptr<GradientEncoder>> Create(const std::string& spec, uint64_t seed, size_t n,
                                                         bool error_feedback, float correction_momentum);

  // Encodes the next gradient (n floats) of `step` into *out. kAborted, touching nothing, when
  // the gradient holds NaN or infinite values (a diverged run), unless allow_overflow() (fp16's
  // loss scaling, where an overflowed step is expected and skipped after the average).
  Status Encode(ConstFloatSpan g, uint64_t step, std::vector<uint8_t>* out);
  // Only without a residual (error feedback, momentum correction), which must never take in an
  // inf: kFailedPrecondition otherwise.
  Status AllowOverflow();
  // The n it was created for (every gradient it encodes has n floats).
  size_t size() const { return size_; }

 private:
  GradientEncoder() = default;
  size_t size_ = 0;
  bool allow_overflow_ = false;
  std::unique_ptr<Compressor> plain_;
  std::unique_ptr<ErrorFeedback> feedback_;
  std::unique_ptr<MomentumCorrection> correction_;
};

}  // namespace gradsync
