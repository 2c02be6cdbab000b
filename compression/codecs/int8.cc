// int8: per bucket of kQuantBucket elements, scale = max|x| / 127 (fp32), q = round(x / scale)
// (to nearest, ties away from zero).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compression/codecs/codecs.h"

namespace gradsync {
namespace {

// Rounds r = x / scale to its level: to nearest (ties away from zero), branch-free so that the
// loop vectorizes. |r| <= 127 for finite x; the clamp keeps the conversion defined where it is
// not: NaN (a NaN x, or inf * 0 in a bucket that holds an infinity) is level 0.
inline int8_t Level(float r) {
  float a = std::fabs(r);
  a = a < 127.0f ? a : 127.0f;  // (NaN too, here)
  a = r == r ? a : 0.0f;
  const float c = std::copysign(a, r);
  return static_cast<int8_t>(static_cast<int>(c + std::copysign(0.5f, c)));
}

class Int8 final : public Compressor {
 public:
  std::string name() const override { return "int8"; }
  Aggregation aggregation() const override { return Aggregation::kGatherOnly; }
  size_t PayloadBytes(size_t n) const override { return n + 4 * ((n + kQuantBucket - 1) / kQuantBucket); }

  void Encode(ConstFloatSpan x, uint64_t, std::vector<uint8_t>* out) override {
    out->resize(PayloadBytes(x.size()));
    uint8_t* w = out->data();
    for (size_t b = 0; b < x.size(); b += kQuantBucket) {
      const size_t e = std::min(x.size(), b + kQuantBucket);
      float m = 0;
      for (size_t i = b; i < e; ++i) m = std::max(m, std::fabs(x[i]));
      const float scale = m / 127.0f;
      std::memcpy(w, &scale, 4);
      w += 4;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      int8_t* q = reinterpret_cast<int8_t*>(w);
      if (std::isinf(inv)) {
        // max|x| < 127 * 2^-128: 1 / scale overflows, so divide (rare; speed does not matter).
        for (size_t i = b; i < e; ++i) q[i - b] = Level(x[i] / scale);
      } else {
        for (size_t i = b; i < e; ++i) q[i - b] = Level(x[i] * inv);
      }
      w += e - b;
    }
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() != PayloadBytes(n) || out.size() != n) {
      return DataLossError("int8 payload has " + std::to_string(p.size()) + " bytes, expected " + std::to_string(PayloadBytes(n)));
    }
    size_t pos = 0;
    for (size_t b = 0; b < n; b += kQuantBucket) {
      const size_t e = std::min(n, b + kQuantBucket);
      const float scale = payload::GetF32(p.data() + pos);
      pos += 4;
      if (!std::isfinite(scale) || scale < 0) return DataLossError("int8 payload has a bad scale");
      for (size_t i = b; i < e; ++i) {
        const int8_t q = static_cast<int8_t>(p[pos++]);
        if (q == -128) return DataLossError("int8 payload has a level outside [-127, 127]");
        out[i] = static_cast<float>(q) * scale;
      }
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Compressor> MakeInt8() { return std::make_unique<Int8>(); }

}  // namespace gradsync
