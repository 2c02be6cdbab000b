// Factories of the codecs, one per file (fp16.cc with bf16, int8.cc, qsgd.cc, sign.cc, topk.cc, randomk.cc).
// Use CreateCompressor (compressor.h); these are for it and for tests.
#pragma once

#include <memory>

#include "compression/compressor.h"

namespace gradsync {

// IEEE half precision, 2 bytes per element; ring-summable (pre-divide by n before summing).
std::unique_ptr<Compressor> MakeFp16();
// bfloat16 (float's top 16 bits, rounded to nearest even), 2 bytes per element; ring-summable.
std::unique_ptr<Compressor> MakeBf16();
// Per bucket of 512: an fp32 scale (max |x| / 127) and one int8 per element, rounded to nearest
// (ties away from zero).
std::unique_ptr<Compressor> MakeInt8();
// QSGD (Alistarh et al. 2017), buckets of 512: the bucket's fp32 L2 norm, then one byte per
// element (sign bit + level in [0, levels]), stochastic rounding seeded by (seed, step).
std::unique_ptr<Compressor> MakeQsgd(int levels, uint64_t seed);
// Scaled sign (Karimireddy et al. 2019): fp32 scale ||x||_1 / n, then n sign bits.
std::unique_ptr<Compressor> MakeSign();
// Exact top-k by magnitude (ties: the lower index wins): uint32 k, k uint32 indices (ascending),
// k fp32 values.
std::unique_ptr<Compressor> MakeTopK(double ratio);
// k indices drawn from (seed, step), the same on every rank: only the k fp32 values travel.
std::unique_ptr<Compressor> MakeRandomK(double ratio, uint64_t seed, bool unbiased);

inline constexpr size_t kQuantBucket = 512;

}  // namespace gradsync
