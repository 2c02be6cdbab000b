// Scaled sign (EF-SignSGD, Karimireddy et al. 2019): delta = (||x||_1 / n) * sign(x), sign(0) = +.
// Payload: fp32 scale, then ceil(n / 8) bytes of sign bits (bit set = negative), LSB first.
#include <cmath>

#include "compression/codecs/codecs.h"

namespace gradsync {
namespace {

class Sign final : public Compressor {
 public:
  std::string name() const override { return "sign"; }
  Aggregation aggregation() const override { return Aggregation::kGatherOnly; }
  size_t PayloadBytes(size_t n) const override { return 4 + (n + 7) / 8; }

  void Encode(ConstFloatSpan x, uint64_t, std::vector<uint8_t>* out) override {
    out->assign(PayloadBytes(x.size()), 0);
    double l1 = 0;
    for (float v : x) l1 += std::fabs(v);
    const float scale = x.empty() ? 0.0f : static_cast<float>(l1 / static_cast<double>(x.size()));
    std::vector<uint8_t> head;
    payload::PutF32(&head, scale);
    std::copy(head.begin(), head.end(), out->begin());
    uint8_t* bits = out->data() + 4;
    const size_t full = x.size() / 8;
    for (size_t byte = 0; byte < full; ++byte) {
      const float* v = x.data() + 8 * byte;
      uint32_t m = 0;
      for (int j = 0; j < 8; ++j) m |= static_cast<uint32_t>(v[j] < 0.0f) << j;
      bits[byte] = static_cast<uint8_t>(m);
    }
    for (size_t i = 8 * full; i < x.size(); ++i) {
      if (x[i] < 0.0f) bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    }
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() != PayloadBytes(n) || out.size() != n) {
      return DataLossError("sign payload has " + std::to_string(p.size()) + " bytes, expected " + std::to_string(PayloadBytes(n)));
    }
    const float scale = payload::GetF32(p.data());
    if (!std::isfinite(scale) || scale < 0) return DataLossError("sign payload has a bad scale");
    const uint8_t* bits = p.data() + 4;
    const size_t full = n / 8;
    for (size_t byte = 0; byte < full; ++byte) {
      const uint32_t m = bits[byte];
      float* o = out.data() + 8 * byte;
      for (int j = 0; j < 8; ++j) o[j] = ((m >> j) & 1u) ? -scale : scale;
    }
    for (size_t i = 8 * full; i < n; ++i) out[i] = (bits[i >> 3] >> (i & 7)) & 1u ? -scale : scale;
    // Padding bits past n must be zero: anything else is not a payload this codec wrote.
    if (n % 8 && (bits[n / 8] >> (n % 8))) return DataLossError("sign payload has padding bits set");
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Compressor> MakeSign() { return std::make_unique<Sign>(); }

}  // namespace gradsync
