#include "server/shard/transform/delay_compensation.h"

#include <algorithm>
#include <cmath>

#include "common/obs/trace.h"

namespace gradsync {

DelayCompensation::DelayCompensation(const DelayCompensationOptions& options, Segment range, int num_workers)
    : options_(options), range_(range), pulled_(static_cast<size_t>(std::max(0, num_workers))) {
  if (options_.adaptive) mean_square_.assign(static_cast<size_t>(range_.size()), 0.0f);
}

void DelayCompensation::Pulled(int worker, std::span<const Segment> segments, std::span<const float> params) {
  if (worker < 0 || static_cast<size_t>(worker) >= pulled_.size()) return;
  std::vector<float>& mine = pulled_[static_cast<size_t>(worker)];
  // A worker's first pull reads every element it will push (a dense model's whole range).
  if (mine.empty()) mine.assign(params.begin(), params.end());
  for (const Segment& s : segments) {
    const int64_t local = s.begin - range_.begin;
    std::copy_n(params.begin() + local, s.size(), mine.begin() + local);
  }
}

void DelayCompensation::Transform(int worker, HeldPush* push, std::span<const float> params) {
  TraceSpan span("delay compensation", "server", {{"worker", static_cast<double>(worker)}});
  bool known = true;
  for (PushChunk& c : push->chunks) {
    PushChunk out;
    out.segments = std::move(c.segments);
    out.absent = std::move(c.absent);
    size_t n = 0;
    for (const Segment& s : out.segments) n += static_cast<size_t>(s.size());
    out.owned.resize(n);
    known = Correct(worker, out.segments, c.values(), params, out.owned.data());
    c = std::move(out);  // the values as they came are let go
  }
  Counted(known);
}

bool DelayCompensation::Correct(int worker, std::span<const Segment> segments, const float* values,
                                std::span<const float> params, float* out) {
  const bool known = worker >= 0 && static_cast<size_t>(worker) < pulled_.size() && !pulled_[static_cast<size_t>(worker)].empty();
  size_t k = 0;
  if (!known) {
    for (const Segment& s : segments) k += static_cast<size_t>(s.size());
    std::copy_n(values, k, out);
    return false;
  }
  const std::vector<float>& bak = pulled_[static_cast<size_t>(worker)];
  const float m = options_.mean_square_decay;
  for (const Segment& s : segments) {
    const int64_t local = s.begin - range_.begin;
    const float* now = params.data() + local;
    const float* was = bak.data() + local;
    const int64_t n = s.size();
    const size_t first = k;
    if (!options_.adaptive) {
      const float lambda = options_.lambda;
      for (int64_t i = 0; i < n; ++i, ++k) {
        const float g = values[k];
        out[k] = g + lambda * g * g * (now[i] - was[i]);
      }
    } else {
      float* ms = mean_square_.data() + local;
      for (int64_t i = 0; i < n; ++i, ++k) {
        const float g = values[k];
        ms[i] = m * ms[i] + (1 - m) * g * g;
        const float lambda = options_.lambda / std::sqrt(ms[i] + options_.epsilon);
        out[k] = g + lambda * g * g * (now[i] - was[i]);
      }
    }
    AddSquares(values + first, out + first, n);
  }
  return true;
}

void DelayCompensation::AddSquares(const float* g, const float* corrected, int64_t n) {
  // A pass of its own, vectorized as an OpenMP SIMD reduction (-fopenmp-simd on this file: no
  // threads, no runtime); folded into the loops above as a plain sum it kept them scalar (the
  // constant variant 6x slower). In float a block at a time, added up in double.
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    float gs = 0, cs = 0;
#pragma omp simd reduction(+ : gs, cs)
    for (int64_t i = begin; i < end; ++i) {
      const float c = corrected[i] - g[i];
      gs += g[i] * g[i];
      cs += c * c;
    }
    gradient_sq_ += gs;
    correction_sq_ += cs;
  }
}

double DelayCompensation::relative_correction() const {
  return gradient_sq_ > 0 ? std::sqrt(correction_sq_ / gradient_sq_) : 0.0;
}

uint64_t DelayCompensation::bytes() const {
  uint64_t floats = mean_square_.size();
  for (const auto& p : pulled_) floats += p.size();
  return floats * sizeof(float);
}

}  // namespace gradsync
