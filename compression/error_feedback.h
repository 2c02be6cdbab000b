// ErrorFeedback: wraps any Compressor and keeps one fp32 residual (Seide 2014; Karimireddy et
// al. 2019):  p = g + e;  c = C(p);  e = p - D(c);  send c.
// It sits on gradients, before the learning rate and momentum (the receiver's optimizer sees
// the decoded gradient). One instance per tensor (or flat buffer) and sender; not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "compression/compressor.h"

namespace gradsync {

class ErrorFeedback {
 public:
  ErrorFeedback(std::unique_ptr<Compressor> codec, size_t n);

  // Encodes g + residual into *out and updates the residual.
  void Encode(ConstFloatSpan g, uint64_t step, std::vector<uint8_t>* out);

  const Compressor& codec() const { return *codec_; }
  std::span<const float> residual() const { return residual_; }

 private:
  std::unique_ptr<Compressor> codec_;
  std::vector<float> residual_;
  std::vector<float> corrected_;
  std::vector<float> decoded_;
};

}  // namespace gradsync
