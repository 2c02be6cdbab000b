// The element-wise loops the CPU models share (mlp.cc, dlrm.cc): branch-free loops over restrict
// pointers, so that the compiler vectorizes them. Inline: each model's translation unit compiles
// its own copy, as when they were its own.
#pragma once

#include <algorithm>
#include <cstdint>

namespace gradsync::cpu {

inline void Relu(float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// delta[i] = 0 where the forward activation was clamped (a[i] <= 0).
inline void ReluBackward(const float* __restrict a, int64_t n, float* __restrict delta) {
  for (int64_t i = 0; i < n; ++i) delta[i] = a[i] > 0.0f ? delta[i] : 0.0f;
}

// out[c] = sum_i m[i, c] for a row-major rows x cols matrix.
inline void ColumnSums(const float* __restrict m, int64_t rows, int64_t cols, float* __restrict out) {
  std::fill(out, out + cols, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* __restrict row = m + i * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

}  // namespace gradsync::cpu
