// Seeded random numbers that give the same sequence on every platform and library.
//
// std::mt19937_64's output is fixed by the standard, but std::*_distribution is not, so the
// conversions to floats, integers, normals and permutations are written here. Derive
// independent streams from one seed with Rng::Derive(seed, stream...), e.g.
// Derive(seed, kInitStream, tensor) for initialization and Derive(seed, kDataStream, epoch)
// for the epoch permutation. Not thread-safe: one Rng per thread.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace gradsync {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // A seed for an independent stream, mixed from a base seed and stream ids (splitmix64).
  static uint64_t Derive(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);
  // splitmix64's finaliser: a well-spread 64-bit hash of x (Derive's step).
  static uint64_t SplitMix64(uint64_t x);

  uint64_t NextU64() { return engine_(); }
  // Uniform in [0, 1), 24 random bits.
  float Uniform() { return static_cast<float>(engine_() >> 40) * 0x1.0p-24f; }
  // Uniform in [0, 1), 53 random bits.
  double UniformDouble() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  float Uniform(float lo, float hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n), unbiased (Lemire's method with rejection). n > 0.
  uint64_t UniformInt(uint64_t n);
  // Standard normal (Box-Muller; the second value of each pair is cached).
  double Normal();

  // Fisher-Yates shuffle of 0..n-1.
  std::vector<uint32_t> Permutation(uint32_t n);

 private:
  std::mt19937_64 engine_;
  bool have_spare_ = false;
  double spare_ = 0.0;
};

// Stream ids for Rng::Derive, so that different uses of one seed never share a stream.
inline constexpr uint64_t kInitStream = 1;
inline constexpr uint64_t kDataStream = 2;
inline constexpr uint64_t kSyntheticStream = 3;
inline constexpr uint64_t kShareStream = 4;  // gradsync-sim: the draws of connections' shares of a link
// data/click_log.h: the synthetic click log's hashes.
inline constexpr uint64_t kClickLogStream = 5;

}  // namespace gradsync
