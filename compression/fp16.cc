// fp16: IEEE 754 binary16, round to nearest even (F16C when the CPU has it, bit-exact fallback).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "compression/codecs.h"

namespace gradsync {
namespace {

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

const bool kHasF16C = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");

class Fp16 final : public Compressor {
 public:
  std::string name() const override { return "fp16"; }
  Aggregation aggregation() const override { return Aggregation::kRingSummable; }
  size_t PayloadBytes(size_t n) const override { return 2 * n; }

  void Encode(ConstFloatSpan x, uint64_t, std::vector<uint8_t>* out) override {
    out->resize(2 * x.size());
    uint16_t* h = reinterpret_cast<uint16_t*>(out->data());
    if (kHasF16C) {
      EncodeF16C(x.data(), x.size(), h);
    } else {
      for (size_t i = 0; i < x.size(); ++i) h[i] = FloatToHalf(x[i]);
    }
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() != 2 * n || out.size() != n) {
      return DataLossError("fp16 payload has " + std::to_string(p.size()) + " bytes for " + std::to_string(n) + " elements");
    }
    std::vector<uint16_t> h(n);  // the payload need not be aligned
    std::memcpy(h.data(), p.data(), p.size());
    if (kHasF16C) {
      DecodeF16C(h.data(), n, out.data());
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(h[i]);
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Compressor> MakeFp16() { return std::make_unique<Fp16>(); }

}  // namespace gradsync
