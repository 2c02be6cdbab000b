// The two 16-bit float formats over whole buffers, rounded to nearest even:
//   half (IEEE 754 binary16): 5 exponent bits, 10 mantissa bits, largest finite 65504; F16C
//     when the CPU has it and a bit-exact scalar fallback otherwise;
//   bfloat16: float's 8 exponent bits (float's range) and 7 mantissa bits: a float's top half,
//     rounded; NaN stays NaN.
// The 16-bit codecs (fp16, bf16), the ring's 16-bit all-reduce and the models' 16-bit
// precisions (--precision) all use these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradsync {

uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// out[i] = half(x[i]).
void FloatsToHalves(const float* x, size_t n, uint16_t* out);
// out[i] = float(h[i]).
void HalvesToFloats(const uint16_t* h, size_t n, float* out);
// acc[i] = half(float(acc[i]) + float(x[i])): one rounding per addition, as a half-precision
// reduction does (NCCL's ncclHalf sum, for instance).
void AddHalves(uint16_t* acc, const uint16_t* x, size_t n);

uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);
void FloatsToBf16s(const float* x, size_t n, uint16_t* out);
void Bf16sToFloats(const uint16_t* b, size_t n, float* out);
// acc[i] = bf16(float(acc[i]) + float(x[i])).
void AddBf16s(uint16_t* acc, const uint16_t* x, size_t n);

// Which 16-bit format a buffer of uint16_t holds.
enum class Float16 { kHalf, kBfloat16 };
const char* Float16Name(Float16 f);  // "fp16" | "bf16"
void FloatsTo16(Float16 f, const float* x, size_t n, uint16_t* out);
void Float16sToFloats(Float16 f, const uint16_t* h, size_t n, float* out);
void Add16(Float16 f, uint16_t* acc, const uint16_t* x, size_t n);
// x[i] = float(f(x[i])) in place: the value a 16-bit store of x[i] would read back (half:
// beyond 65504 it is infinite). What the CPU models' 16-bit precisions do to their operands.
void RoundTo16(Float16 f, float* x, size_t n);

}  // namespace gradsync
