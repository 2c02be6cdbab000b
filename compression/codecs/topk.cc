// Exact top-k by magnitude. Ties are broken by index (the lower index ranks higher), so the set
// is a function of x alone. Payload: uint32 k, k uint32 indices in ascending order, k fp32 values.
#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <numeric>

#include "compression/codecs/codecs.h"

namespace gradsync {
namespace {

// |v|, with NaN ranked as the largest magnitude (as +inf): a NaN gradient is sent, as it would be
// uncompressed, and the magnitudes stay totally ordered (nth_element and the tie count need it).
inline float Magnitude(float v) {
  const float m = std::fabs(v);
  return m == m ? m : std::numeric_limits<float>::infinity();
}

class TopK final : public Compressor {
 public:
  explicit TopK(double ratio) : ratio_(ratio) {}
  std::string name() const override { return "topk:" + std::to_string(ratio_); }
  Aggregation aggregation() const override { return Aggregation::kGatherOnly; }
  bool sparse() const override { return true; }
  size_t PayloadBytes(size_t n) const override { return 4 + 8 * KeptElements(n, ratio_); }

  void Encode(ConstFloatSpan x, uint64_t, std::vector<uint8_t>* out) override {
    const size_t n = x.size(), k = KeptElements(n, ratio_);
    idx_.clear();
    if (k > 0) {
      // The k-th largest magnitude t (nth_element over a contiguous copy), then one pass: every
      // |x| > t, and as many |x| == t as are left, lowest indices first.
      mags_.resize(n);
      for (size_t i = 0; i < n; ++i) mags_[i] = Magnitude(x[i]);
      std::nth_element(mags_.begin(), mags_.begin() + static_cast<std::ptrdiff_t>(k - 1), mags_.end(), std::greater<float>());
      const float t = mags_[k - 1];
      size_t above = 0;
      for (size_t i = 0; i < n; ++i) above += Magnitude(x[i]) > t;
      size_t ties_left = k - above;
      for (size_t i = 0; i < n; ++i) {
        const float m = Magnitude(x[i]);
        if (m > t || (m == t && ties_left > 0 && ties_left--)) idx_.push_back(static_cast<uint32_t>(i));
      }
    }
    out->clear();
    out->reserve(PayloadBytes(n));
    payload::PutU32(out, static_cast<uint32_t>(k));
    for (size_t i = 0; i < k; ++i) payload::PutU32(out, idx_[i]);
    for (size_t i = 0; i < k; ++i) payload::PutF32(out, x[idx_[i]]);
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() < 4 || out.size() != n) return DataLossError("top-k payload is truncated");
    const uint32_t k = payload::GetU32(p.data());
    if (k != KeptElements(n, ratio_) || p.size() != 4 + 8 * static_cast<size_t>(k)) {
      return DataLossError("top-k payload announces " + std::to_string(k) + " elements in " + std::to_string(p.size()) +
                           " bytes; this codec sends " + std::to_string(KeptElements(n, ratio_)) + " of " + std::to_string(n));
    }
    std::fill(out.begin(), out.end(), 0.0f);
    const uint8_t* ip = p.data() + 4;
    const uint8_t* vp = ip + 4 * static_cast<size_t>(k);
    int64_t last = -1;
    for (uint32_t i = 0; i < k; ++i) {
      const uint32_t index = payload::GetU32(ip + 4 * i);
      if (index >= n || static_cast<int64_t>(index) <= last) {
        return DataLossError("top-k payload index " + std::to_string(index) + " is out of range or out of order");
      }
      last = index;
      out[index] = payload::GetF32(vp + 4 * i);
    }
    return OkStatus();
  }

 private:
  double ratio_;
  std::vector<uint32_t> idx_;
  std::vector<float> mags_;
};

}  // namespace

std::unique_ptr<Compressor> MakeTopK(double ratio) { return std::make_unique<TopK>(ratio); }

}  // namespace gradsync
