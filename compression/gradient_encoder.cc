#include "compression/gradient_encoder.h"

namespace gradsync {

Result<std::unique_ptr<GradientEncoder>> GradientEncoder::Create(const std::string& spec, uint64_t seed, size_t n,
                                                                 bool error_feedback, float correction_momentum) {
  const bool correct = correction_momentum > 0;
  ASSIGN_OR_RETURN(auto codec, CreateCompressor(spec, seed, /*unbiased_randomk=*/!error_feedback && !correct));
  if (!codec) return InvalidArgumentError("no codec to encode gradients with ('" + spec + "')");
  if (correct && !codec->sparse()) return InvalidArgumentError("momentum correction needs top-k or random-k");
  auto e = std::unique_ptr<GradientEncoder>(new GradientEncoder());
  e->size_ = n;
  if (correct) e->correction_ = std::make_unique<MomentumCorrection>(std::move(codec), n, correction_momentum);
  else if (error_feedback) e->feedback_ = std::make_unique<ErrorFeedback>(std::move(codec), n);
  else e->plain_ = std::move(codec);
  return e;
}

Status GradientEncoder::Encode(ConstFloatSpan g, uint64_t step, std::vector<uint8_t>* out) {
  // A diverged gradient is the run's end, said plainly: the residual memories must never take
  // it in, and some codecs' payloads cannot carry it.
  if (!allow_overflow_ && !AllFinite(g)) {
    return AbortedError("the gradient holds NaN or infinite values at step " + std::to_string(step) +
                        ": training diverged (lower --lr?)");
  }
  if (correction_) correction_->Encode(g, step, out);
  else if (feedback_) feedback_->Encode(g, step, out);
  else plain_->Encode(g, step, out);
  return OkStatus();
}

Status GradientEncoder::AllowOverflow() {
  if (!plain_) {
    return FailedPreconditionError("a gradient codec with a residual (error feedback, momentum correction) cannot carry "
                                   "the overflowed steps of fp16's loss scaling");
  }
  allow_overflow_ = true;
  return OkStatus();
}

}  // namespace gradsync
