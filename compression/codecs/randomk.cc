// Random-k: k distinct indices drawn from (seed, step), identical on every rank of a job for the
// same step, so only the k fp32 values travel and payloads of different ranks can be summed
// element by element (inside a ring). Unbiased variant: values scaled by n / k (for use without
// error feedback). Payload: k fp32 values.
#include <algorithm>

#include "common/base/numeric/rng.h"
#include "compression/codecs/codecs.h"

namespace gradsync {
namespace {

class RandomK final : public Compressor {
 public:
  RandomK(double ratio, uint64_t seed, bool unbiased) : ratio_(ratio), seed_(seed), unbiased_(unbiased) {}
  std::string name() const override { return "randomk:" + std::to_string(ratio_); }
  Aggregation aggregation() const override { return Aggregation::kRingSummable; }
  bool sparse() const override { return true; }
  size_t PayloadBytes(size_t n) const override { return 4 * KeptElements(n, ratio_); }

  // The step's index set (k draws, no full permutation), sorted.
  const std::vector<uint32_t>& Indices(size_t n, uint64_t step) const {
    const size_t k = KeptElements(n, ratio_);
    if (cached_n_ == n && cached_step_ == step && idx_.size() == k) return idx_;
    Rng rng(Rng::Derive(seed_, 0x7a4d, step));
    idx_.clear();
    // Floyd's algorithm over a bitmap of n bits; scanning the bitmap yields the set sorted.
    chosen_.assign((n + 63) / 64, 0);
    auto test_and_set = [&](size_t i) {
      const uint64_t bit = uint64_t{1} << (i & 63);
      const bool was = chosen_[i >> 6] & bit;
      chosen_[i >> 6] |= bit;
      return was;
    };
    for (size_t j = n - k; j < n; ++j) {
      const size_t t = static_cast<size_t>(rng.UniformInt(j + 1));
      if (test_and_set(t)) test_and_set(j);
    }
    idx_.reserve(k);
    for (size_t w = 0; w < chosen_.size(); ++w) {
      for (uint64_t bits = chosen_[w]; bits; bits &= bits - 1) {
        idx_.push_back(static_cast<uint32_t>(64 * w + static_cast<size_t>(__builtin_ctzll(bits))));
      }
    }
    cached_n_ = n;
    cached_step_ = step;
    return idx_;
  }

  void Encode(ConstFloatSpan x, uint64_t step, std::vector<uint8_t>* out) override {
    const auto& idx = Indices(x.size(), step);
    const float scale = unbiased_ && !idx.empty() ? static_cast<float>(x.size()) / static_cast<float>(idx.size()) : 1.0f;
    out->clear();
    out->reserve(4 * idx.size());
    for (uint32_t i : idx) payload::PutF32(out, x[i] * scale);
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t step, FloatSpan out) const override {
    if (p.size() != PayloadBytes(n) || out.size() != n) {
      return DataLossError("random-k payload has " + std::to_string(p.size()) + " bytes, expected " + std::to_string(PayloadBytes(n)));
    }
    const auto& idx = Indices(n, step);
    std::fill(out.begin(), out.end(), 0.0f);
    for (size_t i = 0; i < idx.size(); ++i) out[idx[i]] = payload::GetF32(p.data() + 4 * i);
    return OkStatus();
  }

 private:
  double ratio_;
  uint64_t seed_;
  bool unbiased_;
  mutable std::vector<uint32_t> idx_;
  mutable std::vector<uint64_t> chosen_;
  mutable size_t cached_n_ = SIZE_MAX;
  mutable uint64_t cached_step_ = 0;
};

}  // namespace

std::unique_ptr<Compressor> MakeRandomK(double ratio, uint64_t seed, bool unbiased) {
  return std::make_unique<RandomK>(ratio, seed, unbiased);
}

}  // namespace gradsync
