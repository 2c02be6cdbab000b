#include "common/data/click/zipf.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "common/base/check.h"

namespace gradsync {
namespace {

// log1p(t) / t and expm1(t) / t, by their Taylor series near 0 (both are 1 at t = 0: what makes
// the hat's integral and its inverse continuous at s = 1).
double Log1pOver(double t) {
  if (std::abs(t) > 1e-8) return std::log1p(t) / t;
  return 1.0 - t * (0.5 - t * (1.0 / 3.0 - 0.25 * t));
}
double Expm1Over(double t) {
  if (std::abs(t) > 1e-8) return std::expm1(t) / t;
  return 1.0 + t * 0.5 * (1.0 + t * (1.0 / 3.0) * (1.0 + 0.25 * t));
}

uint64_t LowMask(int bits) { return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

}  // namespace

ZipfSampler::ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
  GRADSYNC_CHECK(n >= 1 && n <= kMaxZipfRange) << "Zipf range " << n;
  GRADSYNC_CHECK(s > 0.0 && s <= 3.0) << "Zipf exponent " << s;
  integral_x1_ = HatIntegral(1.5) - 1.0;
  integral_n_ = HatIntegral(static_cast<double>(n) + 0.5);
  shortcut_ = 2.0 - HatIntegralInverse(HatIntegral(2.5) - Hat(2.0));
  // Below spread_from_ the values of x that adjacent values of u give are under half a rank
  // apart: one step of u moves x by about ulp(u) * x^s, and x is known to a relative 2^-44.
  double u_ulp = std::ldexp(std::max(std::abs(integral_x1_), std::abs(integral_n_)), -52);
  spread_from_ = std::min(std::pow(0.25 / u_ulp, 1.0 / s), 0x1.0p43);
}

double ZipfSampler::Hat(double x) const { return std::exp(-s_ * std::log(x)); }

double ZipfSampler::HatIntegral(double x) const {
  double log_x = std::log(x);
  return Expm1Over((1.0 - s_) * log_x) * log_x;
}

double ZipfSampler::HatIntegralInverse(double u) const {
  // t >= -1 in exact arithmetic; rounding may push it just below.
  double t = std::max(u * (1.0 - s_), -1.0);
  return std::exp(Log1pOver(t) * u);
}

uint64_t ZipfSampler::Round(double x) const {
  double y = x + 0.5;
  if (!(y >= 1.0)) return 1;
  if (!(y < 0x1.0p63)) return n_;
  uint64_t k = static_cast<uint64_t>(y);
  return k < 1 ? 1 : (k > n_ ? n_ : k);
}

uint64_t ZipfSampler::Sample(SplitMixStream* stream) const {
  for (;;) {
    // u is uniform in (integral_x1_, integral_n_]; x = H^-1(u) has density x^-s on (x1, n + 1/2].
    double u = integral_n_ + stream->Uniform() * (integral_x1_ - integral_n_);
    double x = HatIntegralInverse(u);
    if (x >= spread_from_) {
      // How far apart the values of x that this u and its neighbours give lie: one step of u
      // moves x by ulp(u) / h(x), and x = exp(...) is known to a relative 2^-44 at best.
      // (At most x: coarser only for s near 3 and ranks of total probability below 2^-50.)
      double step =
          std::min(std::max((std::nextafter(u, integral_n_) - u) / Hat(x), std::ldexp(x, -44)), x);
      if (step >= 1.0) {
        // Spread k uniformly over the step, in integers (in doubles it would land on multiples of
        // ulp(x) again). Ranks this far out are accepted with probability 1 - O(1 / k^2): accept
        // them all.
        uint64_t k = Round(x), width = static_cast<uint64_t>(step);
        uint64_t offset = static_cast<uint64_t>(stream->Uniform() * static_cast<double>(width));
        k = k + offset >= width / 2 + 1 ? k + offset - width / 2 : 1;
        return k > n_ ? n_ : k;
      }
    }
    uint64_t k = Round(x);
    // k = 1 is always accepted (u > integral_x1_ = H(1.5) - h(1)); for k >= 2 the draw is
    // accepted with probability h(k) / (H(k + 1/2) - H(k - 1/2)), so k comes out with
    // probability proportional to k^-s. k - x <= shortcut_ implies the second test (the paper's
    // Theorem 2), saving its log and exp on most draws.
    if (static_cast<double>(k) - x <= shortcut_ ||
        u >= HatIntegral(static_cast<double>(k) + 0.5) - Hat(static_cast<double>(k))) {
      return k;
    }
  }
}

IdPermutation::IdPermutation(uint64_t n, uint64_t key) : n_(n) {
  GRADSYNC_CHECK(n >= 1 && n <= kMaxZipfRange) << "id range " << n;
  bits_ = std::max(2, static_cast<int>(std::bit_width(n - 1)));
  low_bits_ = bits_ / 2;
  for (int r = 0; r < kRounds; ++r) keys_[r] = Rng::Derive(key, static_cast<uint64_t>(r));
}

// Round r splits x into a high part `a` (width hi) and a low part `b` (width lo), and writes
// (b, a ^ F_r(b)): the low part moves to the top, so the widths swap for the next round.
uint64_t IdPermutation::Encrypt(uint64_t x) const {
  int lo = low_bits_, hi = bits_ - low_bits_;
  for (int r = 0; r < kRounds; ++r) {
    uint64_t a = x >> lo, b = x & LowMask(lo);
    a ^= Rng::SplitMix64(keys_[r] ^ b) & LowMask(hi);
    x = (b << hi) | a;
    std::swap(lo, hi);
  }
  return x;
}

uint64_t IdPermutation::Decrypt(uint64_t y) const {
  for (int r = kRounds - 1; r >= 0; --r) {
    int lo = (r % 2 == 0) ? low_bits_ : bits_ - low_bits_;
    int hi = bits_ - lo;
    uint64_t b = y >> hi, a = y & LowMask(hi);
    a ^= Rng::SplitMix64(keys_[r] ^ b) & LowMask(hi);
    y = (a << lo) | b;
  }
  return y;
}

uint64_t IdPermutation::Forward(uint64_t x) const {
  GRADSYNC_CHECK(x < n_) << x << " outside [0, " << n_ << ")";
  // Cycle walking: the cycle through x comes back to x < n, so this ends, after fewer than
  // 2^bits_ / n < 2 steps on average.
  uint64_t y = Encrypt(x);
  while (y >= n_) y = Encrypt(y);
  return y;
}

uint64_t IdPermutation::Inverse(uint64_t y) const {
  GRADSYNC_CHECK(y < n_) << y << " outside [0, " << n_ << ")";
  uint64_t x = Decrypt(y);
  while (x >= n_) x = Decrypt(x);
  return x;
}

}  // namespace gradsync
