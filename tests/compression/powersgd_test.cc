// PowerSGD's arithmetic (compression/powersgd.h) on one worker, where an average changes
// nothing: full rank gives the gradient back, a rank-one gradient is exact at rank one, the
// residual holds what the approximation left out and each step approximates its gradient plus
// the last residual from the last step's Q (against the algorithm written out in double), warm
// start converges on a fixed gradient, and the floats exchanged are the formula's.
#include "compression/powersgd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/numeric/rng.h"

namespace gradsync {
namespace {

// A weight of 6 x 5, a bias of 5, a 4 x 2 x 3 tensor (a 4 x 6 matrix), a bias of 3.
std::vector<TensorInfo> Layout() { return PackedLayout({{6, 5}, {5}, {4, 2, 3}, {3}}); }

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.Uniform(-1.0f, 1.0f);
  return v;
}

// One step on one worker (the averages are the identity): the gradient it gives back.
std::vector<float> Step(PowerSgd& p, const std::vector<float>& g) {
  std::vector<float> first(p.first_floats()), second(p.second_floats()), out(g.size());
  p.First(g, first);
  p.Second(first, second);
  p.Finish(first, second, out);
  return out;
}

double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(PowerSgdTest, TheFloatsExchangedAreTheFormulas) {
  // Rank 2: 6x5 -> 2(6+5), bias 5, 4x6 -> 2(4+6), bias 3. Rank 9: each matrix at its smaller side.
  PowerSgd r2(Layout(), 2, 1, true);
  EXPECT_EQ(r2.first_floats(), 2u * 6 + 5 + 2 * 4 + 3);
  EXPECT_EQ(r2.second_floats(), 2u * 5 + 2 * 6);
  EXPECT_EQ(r2.PayloadFloats(), 22u + 5 + 20 + 3);
  EXPECT_EQ(r2.dense_floats(), 30u + 5 + 24 + 3);
  PowerSgd r9(Layout(), 9, 1, true);
  EXPECT_EQ(r9.PayloadFloats(), 5u * 11 + 5 + 4 * 10 + 3);
  EXPECT_EQ(PowerSgd::TensorPayloadFloats({784, 256}, 4), 4u * (784 + 256));
  EXPECT_EQ(PowerSgd::TensorPayloadFloats({32, 1, 5, 5}, 4), 4u * (32 + 25));
  EXPECT_EQ(PowerSgd::TensorPayloadFloats({10}, 4), 10u);
}

TEST(PowerSgdTest, FullRankGivesTheGradientBack) {
  const std::vector<float> g = Random(62, 3);
  PowerSgd p(Layout(), 6, 7, /*error_feedback=*/true);
  const std::vector<float> out = Step(p, g);
  EXPECT_LE(MaxRelativeDiff(out, g, 1e-3), 1e-5);
  for (float e : p.residual()) EXPECT_LE(std::abs(e), 1e-5f);
}

TEST(PowerSgdTest, ARankOneGradientIsExactAtRankOneAndTheResidualHoldsWhatIsLeftOut) {
  // Matrices u vᵀ: rank one.
  std::vector<float> g = Random(62, 5);
  const auto layout = Layout();
  for (const TensorInfo& t : layout) {
    if (t.shape.size() < 2) continue;
    const int64_t n = t.shape[0], m = t.size / n;
    const std::vector<float> u = Random(static_cast<size_t>(n), 11), v = Random(static_cast<size_t>(m), 13);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) g[static_cast<size_t>(t.offset + i * m + j)] = u[i] * v[j];
  }
  PowerSgd p(layout, 1, 7, true);
  EXPECT_LE(MaxRelativeDiff(Step(p, g), g, 1e-3), 1e-5);
  // A full-rank gradient at rank 1: what the approximation leaves out is the residual, and comes
  // back with the next step's gradient.
  const std::vector<float> h = Random(62, 17);
  PowerSgd q(layout, 1, 7, true);
  const std::vector<float> out = Step(q, h);
  size_t k = 0;
  for (const TensorInfo& t : layout) {
    for (int64_t i = 0; i < t.size; ++i) {
      const size_t at = static_cast<size_t>(t.offset + i);
      if (t.shape.size() < 2) {
        EXPECT_EQ(out[at], h[at]);  // biases travel whole
        continue;
      }
      EXPECT_NEAR(out[at] + q.residual()[k++], h[at], 1e-6);
    }
  }
  EXPECT_GT(RelError(out, h), 0.1);
}

// The columns of the row-major n x r matrix `a` made orthonormal (Gram-Schmidt in double, each
// projection taken out twice). Any orthonormal basis of the same span would do: what a step
// gives back, P Pᵀ M, and the span of the next step's M Mᵀ P depend on the span alone.
std::vector<double> Orthonormal(std::vector<double> a, int64_t n, int r) {
  for (int j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += a[i * r + k] * a[i * r + j];
        for (int64_t i = 0; i < n; ++i) a[i * r + j] -= dot * a[i * r + k];
      }
    }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += a[i * r + j] * a[i * r + j];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < n; ++i) a[i * r + j] /= norm;
  }
  return a;
}

// One matrix of the reference: PowerSGD with error feedback written out from its definition.
struct ReferenceMatrix {
  int64_t offset = 0, n = 0, m = 0;
  int r = 0;
  std::vector<double> e;  // the residual: what the last step left out (n x m)
  std::vector<double> q;  // the last step's Q (m x r), this step's start

  // M = g + e; P = orthonormal(M Q); Q = Mᵀ P; the step gives back P Qᵀ (= P Pᵀ M, the
  // projection of M on P's span) into `out`, and keeps e = M − P Qᵀ.
  void Step(const std::vector<float>& grads, std::vector<double>* out) {
    std::vector<double> mm(static_cast<size_t>(n * m));
    for (int64_t i = 0; i < n * m; ++i) mm[i] = grads[static_cast<size_t>(offset + i)] + e[i];
    std::vector<double> p(static_cast<size_t>(n) * r, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int k = 0; k < r; ++k)
        for (int64_t j = 0; j < m; ++j) p[i * r + k] += mm[i * m + j] * q[j * r + k];
    p = Orthonormal(std::move(p), n, r);
    std::fill(q.begin(), q.end(), 0.0);
    for (int64_t j = 0; j < m; ++j)
      for (int k = 0; k < r; ++k)
        for (int64_t i = 0; i < n; ++i) q[j * r + k] += mm[i * m + j] * p[i * r + k];
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double a = 0;
        for (int k = 0; k < r; ++k) a += p[i * r + k] * q[j * r + k];
        (*out)[static_cast<size_t>(offset + i * m + j)] = a;
        e[i * m + j] = mm[i * m + j] - a;
      }
    }
  }
};

// Error feedback, step after step: step t gives back the rank-r approximation of g_t + e_{t-1}
// (e: what the step before left out), one power iteration from the last step's Q (warm start).
// The reference above follows that definition in double; it takes from PowerSgd only what step 1
// ended with: its Q (the second exchange; the first Q is a seeded random matrix) and its
// residual as the definition says, g_1 minus what step 1 gave back. At rank 2 the 6x5 and 4x6
// gradients (of full rank) leave a large residual, so a step that dropped it (M = g alone) or
// started from another Q gives other values.
TEST(PowerSgdTest, EachStepApproximatesTheGradientPlusTheLastResidual) {
  const auto layout = Layout();
  const int rank = 2;
  PowerSgd p(layout, rank, 7, /*error_feedback=*/true);
  const std::vector<float> g1 = Random(62, 31);
  std::vector<float> first(p.first_floats()), second(p.second_floats()), out1(g1.size());
  p.First(g1, first);
  p.Second(first, second);
  p.Finish(first, second, out1);

  std::vector<ReferenceMatrix> ref;
  size_t q_at = 0;
  double e_sq = 0, g_sq = 0;
  for (const TensorInfo& t : layout) {
    if (t.shape.size() < 2) continue;
    ReferenceMatrix mx;
    mx.offset = t.offset;
    mx.n = t.shape[0];
    mx.m = t.size / mx.n;
    mx.r = static_cast<int>(std::min<int64_t>({rank, mx.n, mx.m}));
    for (int64_t i = 0; i < t.size; ++i) {
      const size_t at = static_cast<size_t>(t.offset + i);
      mx.e.push_back(static_cast<double>(g1[at]) - out1[at]);
      e_sq += mx.e.back() * mx.e.back();
      g_sq += static_cast<double>(g1[at]) * g1[at];
    }
    const size_t q_floats = static_cast<size_t>(mx.m * mx.r);
    mx.q.assign(second.begin() + static_cast<std::ptrdiff_t>(q_at),
                second.begin() + static_cast<std::ptrdiff_t>(q_at + q_floats));
    q_at += q_floats;
    ref.push_back(std::move(mx));
  }
  ASSERT_EQ(q_at, p.second_floats());
  // The residual is no rounding error: most of the gradient is left out at rank 2.
  ASSERT_GT(std::sqrt(e_sq / g_sq), 0.3);

  for (int step = 2; step <= 4; ++step) {
    const std::vector<float> g = Random(62, 31 + static_cast<uint64_t>(step));
    const std::vector<float> out = Step(p, g);
    std::vector<double> expect(g.begin(), g.end());  // the biases travel whole
    for (ReferenceMatrix& mx : ref) mx.Step(g, &expect);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      diff = std::max(diff, std::abs(out[i] - expect[i]));
      scale = std::max(scale, std::abs(expect[i]));
    }
    EXPECT_LE(diff, 1e-5 * scale) << "step " << step << ": PowerSGD gave back other values than the rank-" << rank
                                   << " approximation of its gradient plus the last residual (largest difference "
                                   << diff << ", values up to " << scale << ")";
  }
}

TEST(PowerSgdTest, WarmStartConvergesOnAFixedGradient) {
  // The same rank-two gradient step after step: each step is one more power iteration from the
  // last Q, so rank 2 recovers it. Without error feedback the error falls to rounding.
  std::vector<float> g(62, 0.0f);
  const auto layout = Layout();
  for (const TensorInfo& t : layout) {
    const int64_t n = t.shape.size() < 2 ? t.size : t.shape[0], m = t.size / n;
    const std::vector<float> u1 = Random(static_cast<size_t>(n), 21), v1 = Random(static_cast<size_t>(m), 23);
    const std::vector<float> u2 = Random(static_cast<size_t>(n), 25), v2 = Random(static_cast<size_t>(m), 27);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) g[static_cast<size_t>(t.offset + i * m + j)] = 3 * u1[i] * v1[j] + 0.5f * u2[i] * v2[j];
  }
  PowerSgd p(layout, 2, 9, false);
  double first = 0, last = 0;
  for (int s = 0; s < 8; ++s) {
    const double e = RelError(Step(p, g), g);
    if (s == 0) first = e;
    last = e;
  }
  EXPECT_LE(last, 1e-4);
  EXPECT_LE(last, first);
}

}  // namespace
}  // namespace gradsync
