// Zipf-distributed ranks in O(1) time and memory per draw for any range, and a seeded bijection
// of [0, n) that turns a rank into an id: what data/click_log.h draws its categorical ids with.
//
// ZipfSampler draws rank k in [1, n] with probability k^-s / H(n, s) (H the generalized harmonic
// number) by rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-inversion to generate
// variates from monotone discrete distributions", ACM TOMACS 6(2), 1996; with the integral of the
// hat written as ((x^(1-s) - 1) / (1 - s)), which has a limit at s = 1, as Apache Commons RNG's
// RejectionInversionZipfSampler does): a continuous variate x of density x^-s is drawn by
// inverting its integral, rounded to k, and accepted unless it fell in the part of k's cell above
// k^-s (rare: under 2% of draws for s <= 3, and never for k = 1). Far ranks of a huge range lie
// closer together than doubles resolve x (x is known to a relative 2^-44 at best, and near 2^62
// one step of the uniform moves x by about 2^15 ranks for s = 1); where the values of x that
// adjacent uniforms give are a rank or more apart, the draw is spread uniformly over that step
// in integer arithmetic (the pmf changes by a relative 1e-13 or less across it for s <= 1.05,
// 1e-6 for s = 1.5), so every rank stays reachable and none is favoured by rounding.
//
// IdPermutation is a bijection of [0, n) for n up to 2^62: a 4-round unbalanced Feistel network on
// the smallest power of two >= n (halves of floor and ceil of bits/2, round function
// SplitMix64(round key ^ half)), made a bijection of [0, n) by cycle walking (apply it again
// while the value is >= n: fewer than 2 applications on average). Not cryptographic: it only
// scatters popular ranks over the id space so that the hot ids are not 0, 1, 2, ...
//
// Both are immutable after construction and may be used from several threads at once.
#pragma once

#include <array>
#include <cstdint>

#include "common/base/numeric/rng.h"

namespace gradsync {

// splitmix64 as a counter-based stream: word j of the stream with key k is SplitMix64(k + j *
// golden ratio), so a stream is two words of state, made on the spot from a hash of what it is
// for (an example index, a field).
class SplitMixStream {
 public:
  explicit SplitMixStream(uint64_t key) : state_(key) {}
  uint64_t Next() {
    uint64_t word = Rng::SplitMix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return word;
  }
  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// The largest range ZipfSampler and IdPermutation take.
inline constexpr uint64_t kMaxZipfRange = uint64_t{1} << 62;

class ZipfSampler {
 public:
  // 1 <= n <= kMaxZipfRange, 0 < s <= 3 (checked: validate options before).
  ZipfSampler(uint64_t n, double s);

  // A rank in [1, n]; rank 1 is the most likely. Takes one or more words of `stream`.
  uint64_t Sample(SplitMixStream* stream) const;

  uint64_t n() const { return n_; }
  double s() const { return s_; }

 private:
  // The hat's density x^-s, its integral ((x^(1-s) - 1) / (1 - s), log x at s = 1) and inverse.
  double Hat(double x) const;
  double HatIntegral(double x) const;
  double HatIntegralInverse(double u) const;
  // round(x) clamped to [1, n].
  uint64_t Round(double x) const;

  uint64_t n_;
  double s_;
  double integral_x1_;  // HatIntegral(1.5) - 1: the lower end of u
  double integral_n_;   // HatIntegral(n + 0.5): the upper end of u
  double shortcut_;     // k - x <= shortcut_ accepts without evaluating the integral
  double spread_from_;  // below this x, adjacent values of u are < 1 rank apart
};

class IdPermutation {
 public:
  // 1 <= n <= kMaxZipfRange (checked); `key` picks the permutation.
  IdPermutation(uint64_t n, uint64_t key);

  // The image of x in [0, n), and back.
  uint64_t Forward(uint64_t x) const;
  uint64_t Inverse(uint64_t y) const;

  uint64_t n() const { return n_; }

 private:
  static constexpr int kRounds = 4;
  // The Feistel network on [0, 2^bits_) and its inverse.
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t y) const;

  uint64_t n_;
  int bits_;
  int low_bits_;  // the width of the low half before round 0 (bits_ / 2)
  std::array<uint64_t, kRounds> keys_{};
};

}  // namespace gradsync
