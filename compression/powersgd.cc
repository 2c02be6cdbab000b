#include "compression/powersgd.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "common/base/numeric/rng.h"

namespace gradsync {
namespace {

int64_t Cols(const std::vector<int64_t>& shape) {
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return cols;
}

// Makes the r columns of the row-major n x r matrix `p` orthonormal, one after another:
// Gram-Schmidt in double, each column's projections taken out twice ("twice is enough": one
// pass in float leaves a full-rank P far enough from orthonormal to cost the product 1e-5); a
// column with nothing left of it becomes zero.
void Orthonormalize(float* p, int64_t n, int r, std::vector<double>* scratch) {
  std::vector<double>& cols = *scratch;  // column-major copy
  cols.resize(static_cast<size_t>(n) * static_cast<size_t>(r));
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < r; ++j) cols[static_cast<size_t>(j) * n + i] = p[i * r + j];
  for (int j = 0; j < r; ++j) {
    double* c = cols.data() + static_cast<size_t>(j) * n;
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        const double* b = cols.data() + static_cast<size_t>(k) * n;
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += b[i] * c[i];
        for (int64_t i = 0; i < n; ++i) c[i] -= dot * b[i];
      }
    }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += c[i] * c[i];
    norm = std::sqrt(norm);
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (int64_t i = 0; i < n; ++i) c[i] *= inv;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < r; ++j) p[i * r + j] = static_cast<float>(cols[static_cast<size_t>(j) * n + i]);
}

}  // namespace

size_t PowerSgd::TensorPayloadFloats(const std::vector<int64_t>& shape, int rank) {
  if (shape.size() < 2) return static_cast<size_t>(ShapeSize(shape));
  const int64_t n = shape[0], m = Cols(shape);
  const int64_t r = std::min<int64_t>({rank, n, m});
  return static_cast<size_t>(r * (n + m));
}

PowerSgd::PowerSgd(const std::vector<TensorInfo>& layout, int rank, uint64_t seed, bool error_feedback)
    : error_feedback_(error_feedback) {
  size_t m_floats = 0;
  for (const TensorInfo& t : layout) {
    if (t.sparse) continue;
    dense_floats_ += static_cast<size_t>(t.size);
    if (t.shape.size() < 2) {
      whole_.push_back({t.offset, t.offset + t.size});
      continue;
    }
    Matrix mx;
    mx.offset = t.offset;
    mx.rows = t.shape[0];
    mx.cols = Cols(t.shape);
    mx.rank = static_cast<int>(std::min<int64_t>({rank, mx.rows, mx.cols}));
    mx.m_at = m_floats;
    mx.p_at = first_floats_;
    mx.q_at = second_floats_;
    m_floats += static_cast<size_t>(t.size);
    first_floats_ += static_cast<size_t>(mx.rows * mx.rank);
    second_floats_ += static_cast<size_t>(mx.cols * mx.rank);
    matrices_.push_back(mx);
  }
  whole_at_ = first_floats_;
  for (const Segment& s : whole_) first_floats_ += static_cast<size_t>(s.size());
  m_.assign(m_floats, 0.0f);
  if (error_feedback_) error_.assign(m_floats, 0.0f);
  // The first Q: standard normal, the same on every worker.
  q_.resize(second_floats_);
  Rng rng(Rng::Derive(seed, 0x9053D));
  for (float& q : q_) q = static_cast<float>(rng.Normal());
}

void PowerSgd::First(ConstFloatSpan grads, FloatSpan first) {
  for (const Matrix& mx : matrices_) {
    const size_t n = static_cast<size_t>(mx.rows * mx.cols);
    float* m = m_.data() + mx.m_at;
    const float* g = grads.data() + mx.offset;
    if (error_feedback_) {
      const float* e = error_.data() + mx.m_at;
      for (size_t i = 0; i < n; ++i) m[i] = g[i] + e[i];
    } else {
      std::copy_n(g, n, m);
    }
    // P = M Q: (rows x cols) (cols x r).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(mx.rows), mx.rank, static_cast<int>(mx.cols),
                1.0f, m, static_cast<int>(mx.cols), q_.data() + mx.q_at, mx.rank, 0.0f, first.data() + mx.p_at, mx.rank);
  }
  size_t at = whole_at_;
  for (const Segment& s : whole_) {
    std::copy_n(grads.data() + s.begin, s.size(), first.data() + at);
    at += static_cast<size_t>(s.size());
  }
}

void PowerSgd::Second(FloatSpan first, FloatSpan second) {
  for (const Matrix& mx : matrices_) {
    float* p = first.data() + mx.p_at;
    Orthonormalize(p, mx.rows, mx.rank, &orth_);
    // Q = Mᵀ P: (cols x rows) (rows x r).
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(mx.cols), mx.rank, static_cast<int>(mx.rows),
                1.0f, m_.data() + mx.m_at, static_cast<int>(mx.cols), p, mx.rank, 0.0f, second.data() + mx.q_at, mx.rank);
  }
}

void PowerSgd::Finish(ConstFloatSpan first, ConstFloatSpan second, FloatSpan grads) {
  for (const Matrix& mx : matrices_) {
    float* g = grads.data() + mx.offset;
    // The averaged gradient's approximation: P Qᵀ, (rows x r) (r x cols).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(mx.rows), static_cast<int>(mx.cols), mx.rank,
                1.0f, first.data() + mx.p_at, mx.rank, second.data() + mx.q_at, mx.rank, 0.0f, g,
                static_cast<int>(mx.cols));
    const size_t n = static_cast<size_t>(mx.rows * mx.cols);
    if (error_feedback_) {
      const float* m = m_.data() + mx.m_at;
      float* e = error_.data() + mx.m_at;
      for (size_t i = 0; i < n; ++i) e[i] = m[i] - g[i];
    }
    std::copy_n(second.data() + mx.q_at, static_cast<size_t>(mx.cols * mx.rank), q_.data() + mx.q_at);
  }
  size_t at = whole_at_;
  for (const Segment& s : whole_) {
    std::copy_n(first.data() + at, s.size(), grads.data() + s.begin);
    at += static_cast<size_t>(s.size());
  }
}

}  // namespace gradsync
