// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): rank-r compression of a gradient
// whose parts are averaged by two linear exchanges of small factors, with warm start and error
// feedback, as PyTorch's powerSGD_hook does it. The arithmetic only: the exchanges are the
// caller's (worker/allreduce/dense_averager.h averages `first` and `second` over the workers).
//
// Each dense tensor of two or more dimensions is a matrix M of n = shape[0] rows and m = the
// rest (row-major, as the flat buffer holds it), compressed at rank r' = min(r, n, m); tensors of
// one dimension (biases) travel whole. One step, on every worker:
//
//   First(g, first):    M = g + e (e: this worker's residual, zero without error feedback);
//                       P = M Q into `first` (then the whole tensors' values)
//   ... the caller averages `first` over the workers ...
//   Second(first, second): P orthonormalized (Gram-Schmidt, column by column; every worker has
//                       the same averaged P, so the same result); Q = Mᵀ P into `second`
//   ... the caller averages `second` ...
//   Finish(first, second, g): g = P Qᵀ (the whole tensors: their average); e = M − P Qᵀ; Q is
//                       kept as the next step's start (warm start)
//
// Q starts as the same pseudo-random matrix on every worker (the seed). With r' = min(n, m) the
// product P Qᵀ is the average of the workers' M (P spans M's columns): full rank is the dense
// average to rounding. What travels per step: r'(n + m) floats per matrix and the whole
// tensors' floats (PayloadFloats), in two averages. Not thread-safe; one instance per worker.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/numeric/tensor.h"

namespace gradsync {

class PowerSgd {
 public:
  // `layout`: the model's tensors (sparse ones are left out); `rank` r >= 1; `seed` the same on
  // every worker.
  PowerSgd(const std::vector<TensorInfo>& layout, int rank, uint64_t seed, bool error_feedback);

  // The floats of the first exchange (the P factors, then the whole tensors) and of the second
  // (the Q factors).
  size_t first_floats() const { return first_floats_; }
  size_t second_floats() const { return second_floats_; }
  // What one step exchanges: first_floats() + second_floats().
  size_t PayloadFloats() const { return first_floats_ + second_floats_; }
  // The floats of the dense tensors it compresses or carries (what a dense average would move).
  size_t dense_floats() const { return dense_floats_; }
  // That formula for one tensor shape at rank r: r'(n + m) for a matrix, its size otherwise.
  static size_t TensorPayloadFloats(const std::vector<int64_t>& shape, int rank);

  void First(ConstFloatSpan grads, FloatSpan first);
  void Second(FloatSpan first, FloatSpan second);
  void Finish(ConstFloatSpan first, ConstFloatSpan second, FloatSpan grads);

  // The residual (error feedback) of the matrices, in their order; empty without it.
  const std::vector<float>& residual() const { return error_; }

 private:
  struct Matrix {
    int64_t offset = 0;  // in the flat gradient
    int64_t rows = 0, cols = 0;
    int rank = 0;
    size_t m_at = 0;  // M's place in m_ (and error_)
    size_t p_at = 0;  // P's place in `first`
    size_t q_at = 0;  // Q's place in `second` and q_
  };
  std::vector<Matrix> matrices_;
  std::vector<Segment> whole_;  // tensors sent whole: their runs of the flat gradient
  size_t whole_at_ = 0;         // where they start in `first`
  size_t first_floats_ = 0, second_floats_ = 0, dense_floats_ = 0;
  bool error_feedback_;
  std::vector<float> m_;      // this step's M = g + e, per matrix
  std::vector<float> error_;  // e, per matrix (error feedback)
  std::vector<float> q_;      // Q, kept from step to step (warm start)
  std::vector<double> orth_;  // Second's scratch
};

}  // namespace gradsync
