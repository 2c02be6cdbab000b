// Span helpers over flat float buffers: the one representation of parameters and gradients.
//
// A model's parameters are one contiguous float buffer; each named tensor is a range of it
// (TensorInfo). Gradients have the same layout. These helpers are plain loops the compiler
// vectorizes; nothing here allocates. Spans that are written must not alias spans that are read
// unless a function says so.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"

namespace gradsync {

using FloatSpan = std::span<float>;
using ConstFloatSpan = std::span<const float>;

// One named tensor inside a model's flat parameter buffer.
struct TensorInfo {
  std::string name;            // e.g. "fc1.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // first element in the flat buffer
  int64_t size = 0;            // product of shape
  // Sparse tensors (embedding-like, 2^20+ rows) get gradients only at the keys a batch touches;
  // their dense gradient range is never written (see Model::sparse_grad).
  bool sparse = false;
};

// The part of tensor `t` that flat range `r` (a shard's) holds: [b, e), empty when b >= e.
inline Segment Overlap(const TensorInfo& t, const Segment& r) {
  return {std::max(t.offset, r.begin), std::min(t.offset + t.size, r.end)};
}

// Total element count of a layout (the flat buffer size).
int64_t LayoutSize(const std::vector<TensorInfo>& layout);
// The elements of a tensor of this shape (1 for a scalar's empty shape).
int64_t ShapeSize(const std::vector<int64_t>& shape);
// Dense tensors of these shapes one after another in a flat buffer, named t0, t1, ... (a
// layout of shapes alone: a bucket's, a simulated model's).
std::vector<TensorInfo> PackedLayout(const std::vector<std::vector<int64_t>>& shapes);
// Whether any tensor of the layout is sparse (rows addressed by key).
bool HasSparse(const std::vector<TensorInfo>& layout);

void Fill(FloatSpan x, float value);
void Copy(ConstFloatSpan src, FloatSpan dst);          // sizes must match
void Scale(FloatSpan x, float alpha);                   // x *= alpha
void Axpy(float alpha, ConstFloatSpan x, FloatSpan y);  // y += alpha * x
void Add(ConstFloatSpan x, FloatSpan y);                // y += x
double Dot(ConstFloatSpan x, ConstFloatSpan y);          // in double
double SquaredNorm(ConstFloatSpan x);                    // in double
// max_i |a_i - b_i| / max(|a_i|, |b_i|, floor): relative difference with a floor for ~0 values;
// infinity when either side holds a NaN or an infinity (non-finite values never compare equal).
double MaxRelativeDiff(ConstFloatSpan a, ConstFloatSpan b, double floor = 1e-6);
bool AllFinite(ConstFloatSpan x);

}  // namespace gradsync
