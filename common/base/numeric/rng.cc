#include "common/base/numeric/rng.h"

#include <cmath>
#include <numbers>

namespace gradsync {
namespace {
__extension__ typedef unsigned __int128 U128;
}  // namespace

uint64_t Rng::SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Rng::Derive(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = SplitMix64(seed);
  h = SplitMix64(h ^ a);
  h = SplitMix64(h ^ b);
  return SplitMix64(h ^ c);
}

uint64_t Rng::UniformInt(uint64_t n) {
  // Lemire, "Fast Random Integer Generation in an Interval" (2019).
  U128 m = static_cast<U128>(engine_()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<U128>(engine_()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

double Rng::Normal() {
  if (have_spare_) {
    have_spare_ = false;
    return spare_;
  }
  double u1 = 0.0;
  while (u1 <= 0.0) u1 = UniformDouble();
  double u2 = UniformDouble();
  double r = std::sqrt(-2.0 * std::log(u1));
  double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  have_spare_ = true;
  return r * std::cos(theta);
}

std::vector<uint32_t> Rng::Permutation(uint32_t n) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  for (uint32_t i = n; i > 1; --i) {
    uint32_t j = static_cast<uint32_t>(UniformInt(i));
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

}  // namespace gradsync
