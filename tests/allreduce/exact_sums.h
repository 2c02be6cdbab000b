// Test support for the CPU collective: all-reduces whose results are known exactly.
#pragma once

#include <string>
#include <vector>

#include "allreduce/tcp_ring.h"
#include "common/base/numeric/half.h"

namespace gradsync::testing {

// Rank r of n sums (r + 1) * (i % 7 + 1) at element i, as floats (AllReduce) and as halves
// (AllReduce16, half and bfloat16): small integers, exact in both whatever the order of the additions, so every
// element must be n(n+1)/2 * (i % 7 + 1). kInternal naming the first wrong element otherwise.
inline Status ExactSums(RingCollective& ring, int r, int n, size_t count) {
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
  RETURN_IF_ERROR(ring.AllReduce(x, ReduceOp::kSum));
  for (size_t i = 0; i < count; ++i) {
    if (x[i] != ranks_sum * static_cast<float>(i % 7 + 1)) return InternalError("wrong sum at " + std::to_string(i));
  }
  std::vector<uint16_t> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = FloatToHalf(static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1)));
  RETURN_IF_ERROR(ring.AllReduce16(h, Float16::kHalf));
  for (size_t i = 0; i < count; ++i) {
    if (HalfToFloat(h[i]) != ranks_sum * static_cast<float>(i % 7 + 1)) return InternalError("wrong half sum at " + std::to_string(i));
  }
  // And as bfloat16: 1 or 2 per element on every rank, so that every partial sum is an integer
  // up to 2n, exact in its 8 significant bits for n <= 128.
  for (size_t i = 0; i < count; ++i) h[i] = FloatToBf16(static_cast<float>(i % 2 + 1));
  RETURN_IF_ERROR(ring.AllReduce16(h, Float16::kBfloat16));
  for (size_t i = 0; i < count; ++i) {
    if (Bf16ToFloat(h[i]) != static_cast<float>(n * static_cast<int>(i % 2 + 1))) {
      return InternalError("wrong bf16 sum at " + std::to_string(i));
    }
  }
  return OkStatus();
}

}  // namespace gradsync::testing
