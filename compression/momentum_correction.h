// MomentumCorrection: DGC's momentum correction with momentum-factor masking (Lin et al., ICLR
// 2018), for sparsifying codecs (top-k, random-k):
//   u = m u + g;  v = v + u;  c = C(v);  at every index c carries: u = 0, v = 0.
// v keeps what was not sent (error feedback is built in); the receiver then applies plain SGD
// (no second momentum). One instance per sender and vector; not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "compression/compressor.h"

namespace gradsync {

class MomentumCorrection {
 public:
  MomentumCorrection(std::unique_ptr<Compressor> codec, size_t n, float momentum);

  void Encode(ConstFloatSpan g, uint64_t step, std::vector<uint8_t>* out);

  std::span<const float> velocity() const { return u_; }
  std::span<const float> accumulated() const { return v_; }

 private:
  std::unique_ptr<Compressor> codec_;
  float momentum_;
  std::vector<float> u_, v_, decoded_;
};

}  // namespace gradsync
