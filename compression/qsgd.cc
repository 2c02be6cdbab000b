// QSGD (Alistarh et al., NeurIPS 2017) with s levels, buckets of kQuantBucket elements:
//   l = floor(s |v_i| / ||v||_2); xi = (l + 1) / s with probability s |v_i| / ||v||_2 - l, else l / s;
//   Q(v)_i = ||v||_2 * sign(v_i) * xi.      Unbiased; variance <= min(b / s^2, sqrt(b) / s) ||v||^2.
// Payload per bucket: fp32 norm, then one byte per element: bit 7 = sign, bits 0-6 = level.
#include <algorithm>
#include <cmath>

#include "common/rng.h"
#include "compression/codecs.h"

namespace gradsync {
namespace {

class Qsgd final : public Compressor {
 public:
  Qsgd(int levels, uint64_t seed) : levels_(levels), seed_(seed) {}
  std::string name() const override { return "qsgd:" + std::to_string(levels_); }
  Aggregation aggregation() const override { return Aggregation::kGatherOnly; }
  size_t PayloadBytes(size_t n) const override { return n + 4 * ((n + kQuantBucket - 1) / kQuantBucket); }

  void Encode(ConstFloatSpan x, uint64_t step, std::vector<uint8_t>* out) override {
    out->clear();
    out->reserve(PayloadBytes(x.size()));
    Rng rng(Rng::Derive(seed_, 0x9564, step));
    const float s = static_cast<float>(levels_);
    for (size_t b = 0; b < x.size(); b += kQuantBucket) {
      const size_t e = std::min(x.size(), b + kQuantBucket);
      double sq = 0;
      for (size_t i = b; i < e; ++i) sq += static_cast<double>(x[i]) * x[i];
      const float norm = static_cast<float>(std::sqrt(sq));
      payload::PutF32(out, norm);
      const float inv = norm > 0 ? s / norm : 0.0f;
      for (size_t i = b; i < e; ++i) {
        const float r = std::min(s, std::fabs(x[i]) * inv);
        float l = std::floor(r);
        if (rng.Uniform() < r - l) l += 1.0f;
        l = std::min(l, s);
        out->push_back(static_cast<uint8_t>((x[i] < 0 ? 0x80u : 0u) | static_cast<uint32_t>(l)));
      }
    }
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() != PayloadBytes(n) || out.size() != n) {
      return DataLossError("qsgd payload has " + std::to_string(p.size()) + " bytes, expected " + std::to_string(PayloadBytes(n)));
    }
    const float s = static_cast<float>(levels_);
    size_t pos = 0;
    for (size_t b = 0; b < n; b += kQuantBucket) {
      const size_t e = std::min(n, b + kQuantBucket);
      const float norm = payload::GetF32(p.data() + pos);
      pos += 4;
      if (!std::isfinite(norm) || norm < 0) return DataLossError("qsgd payload has a bad norm");
      const float unit = norm / s;
      for (size_t i = b; i < e; ++i) {
        const uint8_t c = p[pos++];
        const int level = c & 0x7f;
        if (level > levels_) return DataLossError("qsgd payload has level " + std::to_string(level) + " > " + std::to_string(levels_));
        const float mag = unit * static_cast<float>(level);
        out[i] = (c & 0x80) ? -mag : mag;
      }
    }
    return OkStatus();
  }

 private:
  int levels_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<Compressor> MakeQsgd(int levels, uint64_t seed) { return std::make_unique<Qsgd>(levels, seed); }

}  // namespace gradsync
