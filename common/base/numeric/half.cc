#include "common/base/numeric/half.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gradsync {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    float a;
    std::memcpy(&a, &abs, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));  // a / 2^-24
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits (nearest, ties to even).
  const uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // -112 << 23 rebias, + rounding
  return static_cast<uint16_t>(sign | (abs >> 13));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

__attribute__((target("avx,f16c"))) void EncodeF16C(const float* x, size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToHalf(x[i]);
}

__attribute__((target("avx,f16c"))) void DecodeF16C(const uint16_t* h, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) out[i] = HalfToFloat(h[i]);
}

__attribute__((target("avx,f16c"))) void AddF16C(uint16_t* acc, const uint16_t* x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) acc[i] = FloatToHalf(HalfToFloat(acc[i]) + HalfToFloat(x[i]));
}

// F16C from CPUID leaf 1 (clang before 15 has no __builtin_cpu_supports("f16c")); "avx" also
// checks that the OS saves the YMM registers.
bool CpuHasF16C() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_F16C) != 0 && __builtin_cpu_supports("avx");
}

const bool kHasF16C = CpuHasF16C();

}  // namespace

void FloatsToHalves(const float* x, size_t n, uint16_t* out) {
  if (kHasF16C) return EncodeF16C(x, n, out);
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(x[i]);
}

void HalvesToFloats(const uint16_t* h, size_t n, float* out) {
  if (kHasF16C) return DecodeF16C(h, n, out);
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(h[i]);
}

void AddHalves(uint16_t* acc, const uint16_t* x, size_t n) {
  if (kHasF16C) return AddF16C(acc, x, n);
  for (size_t i = 0; i < n; ++i) acc[i] = FloatToHalf(HalfToFloat(acc[i]) + HalfToFloat(x[i]));
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {
// Nearest, ties to even (a carry into the exponent is right); a NaN stays a (quiet) NaN. A select,
// not a branch, so that the loops below vectorize.
inline uint16_t Bf16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet = (x >> 16) | 0x40u;
  // (A signed comparison, both sides non-negative: SSE2 has no unsigned one.)
  return static_cast<uint16_t>(static_cast<int32_t>(x & 0x7fffffffu) > 0x7f800000 ? quiet : rounded);
}

// AVX-512 BF16 (Cooper Lake, Sapphire Rapids and later): vcvtneps2bf16 rounds to nearest even
// and quiets NaNs, as Bf16Bits does.
__attribute__((target("avx512f,avx512bf16"))) void EncodeBf16Avx512(const float* x, size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    std::memcpy(out + i, &h, sizeof(h));
  }
  for (; i < n; ++i) out[i] = Bf16Bits(x[i]);
}

bool CpuHasAvx512Bf16() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }
const bool kHasAvx512Bf16 = CpuHasAvx512Bf16();
}  // namespace

uint16_t FloatToBf16(float f) { return Bf16Bits(f); }

// Plain loops over restrict pointers: the compiler vectorizes them (the NaN test included).
void FloatsToBf16s(const float* __restrict x, size_t n, uint16_t* __restrict out) {
  if (kHasAvx512Bf16) return EncodeBf16Avx512(x, n, out);
  for (size_t i = 0; i < n; ++i) out[i] = Bf16Bits(x[i]);
}

// A bfloat16 is a float's top half: interleaving zeros below each (SSE2, every x86-64) decodes 8
// at a time.
void Bf16sToFloats(const uint16_t* __restrict b, size_t n, float* __restrict out) {
  size_t i = 0;
  const __m128i zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi16(zero, h));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), _mm_unpackhi_epi16(zero, h));
  }
  for (; i < n; ++i) out[i] = Bf16ToFloat(b[i]);
}

void AddBf16s(uint16_t* acc, const uint16_t* x, size_t n) {
  // Through small stack buffers, so that the vector paths do the conversions.
  constexpr size_t kChunk = 512;
  float a[kChunk], y[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t k = std::min(kChunk, n - i);
    Bf16sToFloats(acc + i, k, a);
    Bf16sToFloats(x + i, k, y);
    for (size_t j = 0; j < k; ++j) a[j] += y[j];
    FloatsToBf16s(a, k, acc + i);
  }
}

const char* Float16Name(Float16 f) { return f == Float16::kHalf ? "fp16" : "bf16"; }

void FloatsTo16(Float16 f, const float* x, size_t n, uint16_t* out) {
  f == Float16::kHalf ? FloatsToHalves(x, n, out) : FloatsToBf16s(x, n, out);
}

void Float16sToFloats(Float16 f, const uint16_t* h, size_t n, float* out) {
  f == Float16::kHalf ? HalvesToFloats(h, n, out) : Bf16sToFloats(h, n, out);
}

void Add16(Float16 f, uint16_t* acc, const uint16_t* x, size_t n) {
  f == Float16::kHalf ? AddHalves(acc, x, n) : AddBf16s(acc, x, n);
}

void RoundTo16(Float16 f, float* x, size_t n) {
  // Through a small stack buffer, so that the vector paths do both directions.
  constexpr size_t kChunk = 1024;
  uint16_t h[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t k = std::min(kChunk, n - i);
    FloatsTo16(f, x + i, k, h);
    Float16sToFloats(f, h, k, x + i);
  }
}

}  // namespace gradsync
