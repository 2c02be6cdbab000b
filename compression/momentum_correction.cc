#include "compression/momentum_correction.h"

#include "common/base/check.h"

namespace gradsync {

MomentumCorrection::MomentumCorrection(std::unique_ptr<Compressor> codec, size_t n, float momentum)
    : codec_(std::move(codec)), momentum_(momentum), u_(n, 0.0f), v_(n, 0.0f), decoded_(n) {
  GRADSYNC_CHECK(codec_ && codec_->sparse()) << "momentum correction needs a sparsifying codec";
}

void MomentumCorrection::Encode(ConstFloatSpan g, uint64_t step, std::vector<uint8_t>* out) {
  GRADSYNC_CHECK(g.size() == u_.size()) << g.size() << " vs " << u_.size();
  for (size_t i = 0; i < g.size(); ++i) {
    u_[i] = momentum_ * u_[i] + g[i];
    v_[i] += u_[i];
  }
  codec_->Encode(v_, step, out);
  Status s = codec_->Decode(*out, g.size(), step, decoded_);
  GRADSYNC_CHECK(s.ok()) << "a codec could not decode its own payload: " << s;
  // Momentum-factor masking: what was sent leaves both accumulators.
  for (size_t i = 0; i < g.size(); ++i) {
    if (decoded_[i] != 0.0f) {
      v_[i] -= decoded_[i];
      u_[i] = 0.0f;
    }
  }
}

}  // namespace gradsync
