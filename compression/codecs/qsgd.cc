// QSGD (Alistarh et al., NeurIPS 2017) with s levels, buckets of kQuantBucket elements:
//   l = floor(s |v_i| / ||v||_2); xi = (l + 1) / s with probability s |v_i| / ||v||_2 - l, else l / s;
//   Q(v)_i = ||v||_2 * sign(v_i) * xi.      Unbiased; variance <= min(b / s^2, sqrt(b) / s) ||v||^2.
// Payload per bucket: fp32 norm, then one byte per element: bit 7 = sign, bits 0-6 = level.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/numeric/rng.h"
#include "compression/codecs/codecs.h"

namespace gradsync {
namespace {

class Qsgd final : public Compressor {
 public:
  Qsgd(int levels, uint64_t seed) : levels_(levels), seed_(seed) {}
  std::string name() const override { return "qsgd:" + std::to_string(levels_); }
  Aggregation aggregation() const override { return Aggregation::kGatherOnly; }
  size_t PayloadBytes(size_t n) const override { return n + 4 * ((n + kQuantBucket - 1) / kQuantBucket); }

  void Encode(ConstFloatSpan x, uint64_t step, std::vector<uint8_t>* out) override {
    out->resize(PayloadBytes(x.size()));
    uint8_t* w = out->data();
    // The rounding draws: a counter-based generator (splitmix64 of seed, step and index), so
    // every element's draw is independent and the loop has no generator state to carry.
    const uint64_t key = Rng::Derive(seed_, 0x9564, step);
    const float s = static_cast<float>(levels_);
    for (size_t b = 0; b < x.size(); b += kQuantBucket) {
      const size_t e = std::min(x.size(), b + kQuantBucket);
      double sq = 0;
      for (size_t i = b; i < e; ++i) sq += static_cast<double>(x[i]) * x[i];
      const float norm = static_cast<float>(std::sqrt(sq));
      std::memcpy(w, &norm, 4);
      w += 4;
      const float inv = norm > 0 ? s / norm : 0.0f;
      for (size_t i = b; i < e; ++i) {
        uint64_t z = key + 0x9e3779b97f4a7c15ULL * (i + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        const float u = static_cast<float>(z >> 40) * 0x1.0p-24f;
        const float r = std::min(s, std::fabs(x[i]) * inv);
        float l = std::floor(r);
        l = std::min(s, l + (u < r - l ? 1.0f : 0.0f));
        *w++ = static_cast<uint8_t>((x[i] < 0 ? 0x80u : 0u) | static_cast<uint32_t>(l));
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
      // Branch-free (it vectorizes); a level out of range is detected for the whole bucket.
      const uint8_t* __restrict c = p.data() + pos;
      float* __restrict o = out.data() + b;
      uint32_t worst = 0;
      for (size_t i = 0; i < e - b; ++i) {
        const uint32_t level = c[i] & 0x7fu;
        worst = std::max(worst, level);
        o[i] = (1.0f - 2.0f * static_cast<float>(c[i] >> 7)) * unit * static_cast<float>(level);
      }
      pos += e - b;
      if (worst > static_cast<uint32_t>(levels_)) {
        return DataLossError("qsgd payload has level " + std::to_string(worst) + " > " + std::to_string(levels_));
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
