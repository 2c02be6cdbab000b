#include "compression/error_feedback.h"

#include "common/base/check.h"

namespace gradsync {

ErrorFeedback::ErrorFeedback(std::unique_ptr<Compressor> codec, size_t n)
    : codec_(std::move(codec)), residual_(n, 0.0f), corrected_(n), decoded_(n) {
  GRADSYNC_CHECK(codec_ != nullptr);
}

void ErrorFeedback::Encode(ConstFloatSpan g, uint64_t step, std::vector<uint8_t>* out) {
  GRADSYNC_CHECK(g.size() == residual_.size()) << g.size() << " vs " << residual_.size();
  for (size_t i = 0; i < g.size(); ++i) corrected_[i] = g[i] + residual_[i];
  codec_->Encode(corrected_, step, out);
  Status s = codec_->Decode(*out, g.size(), step, decoded_);
  GRADSYNC_CHECK(s.ok()) << "a codec could not decode its own payload: " << s;
  for (size_t i = 0; i < g.size(); ++i) residual_[i] = corrected_[i] - decoded_[i];
}

}  // namespace gradsync
