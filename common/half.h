// IEEE 754 binary16 ("half") conversion over whole buffers: round to nearest even, with F16C
// when the CPU has it and a bit-exact scalar fallback otherwise. The fp16 codec and the ring's
// half-precision all-reduce both use it.
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

}  // namespace gradsync
