#include "common/base/numeric/tensor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/base/check.h"

namespace gradsync {

int64_t ShapeSize(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorInfo> PackedLayout(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<TensorInfo> layout;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    const int64_t size = ShapeSize(shape);
    layout.push_back({"t" + std::to_string(layout.size()), shape, offset, size, false});
    offset += size;
  }
  return layout;
}

int64_t LayoutSize(const std::vector<TensorInfo>& layout) {
  int64_t n = 0;
  for (const auto& t : layout) n = std::max(n, t.offset + t.size);
  return n;
}

bool HasSparse(const std::vector<TensorInfo>& layout) {
  return std::any_of(layout.begin(), layout.end(), [](const TensorInfo& t) { return t.sparse; });
}

void Fill(FloatSpan x, float value) { std::fill(x.begin(), x.end(), value); }

void Copy(ConstFloatSpan src, FloatSpan dst) {
  GRADSYNC_CHECK(src.size() == dst.size()) << src.size() << " vs " << dst.size();
  std::copy(src.begin(), src.end(), dst.begin());
}

void Scale(FloatSpan x, float alpha) {
  for (float& v : x) v *= alpha;
}

void Axpy(float alpha, ConstFloatSpan x, FloatSpan y) {
  GRADSYNC_CHECK(x.size() == y.size()) << x.size() << " vs " << y.size();
  const float* xp = x.data();
  float* yp = y.data();
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
}

void Add(ConstFloatSpan x, FloatSpan y) {
  GRADSYNC_CHECK(x.size() == y.size()) << x.size() << " vs " << y.size();
  const float* xp = x.data();
  float* yp = y.data();
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i) yp[i] += xp[i];
}

double Dot(ConstFloatSpan x, ConstFloatSpan y) {
  GRADSYNC_CHECK(x.size() == y.size()) << x.size() << " vs " << y.size();
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

double SquaredNorm(ConstFloatSpan x) { return Dot(x, x); }

double MaxRelativeDiff(ConstFloatSpan a, ConstFloatSpan b, double floor) {
  GRADSYNC_CHECK(a.size() == b.size()) << a.size() << " vs " << b.size();
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double x = a[i], y = b[i];
    // A NaN or an infinity on either side is never "close": comparisons with NaN are false, so
    // without this a non-finite result would pass every tolerance.
    if (!std::isfinite(x) || !std::isfinite(y)) return std::numeric_limits<double>::infinity();
    double denom = std::max({std::fabs(x), std::fabs(y), floor});
    worst = std::max(worst, std::fabs(x - y) / denom);
  }
  return worst;
}

bool AllFinite(ConstFloatSpan x) {
  for (float v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace gradsync
