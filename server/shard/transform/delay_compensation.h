// DelayCompensation: delay-compensated ASGD (Zheng et al., ICML 2017) on one shard, for ssp and
// asp. A worker's gradient was computed on the parameters of its last pull, w_bak; by the time
// the push arrives the shard holds w_now. The shard corrects the gradient with the first-order
// Taylor term, its Hessian approximated by the gradient's outer product's diagonal:
//
//   g' = g + λ · g ⊙ g ⊙ (w_now − w_bak)                        (DC-ASGD-c, constant λ)
//   λ = λ0 / sqrt(ms + ε),  ms ← m · ms + (1 − m) · g ⊙ g        (DC-ASGD-a, per element,
//                                                                  m = 0.95, ε = 1e-7)
//
// and the optimizer takes g' as it takes any push. What it keeps: per worker the values its
// last pull of this shard read (Pulled: the whole range, 4 bytes an element, allocated at the
// worker's first pull), and the adaptive variant one mean square over the range: N + 1 copies
// of the shard's range (bytes()). It is soft state: not in checkpoints or a backup's copy (the
// primary replicates the corrected gradient, so a backup applies what it applied). A push of a
// worker whose pull this shard has not answered since it started (a restart, a takeover) is
// applied uncorrected and counted (uncorrected()). Not thread-safe: the shard's loop drives it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"
#include "server/shard/transform/gradient_transform.h"

namespace gradsync {

struct DelayCompensationOptions {
  float lambda = 0;       // λ, or λ0 of the adaptive variant
  bool adaptive = false;  // DC-ASGD-a
  float mean_square_decay = 0.95f;  // m
  float epsilon = 1e-7f;
};

class DelayCompensation final : public GradientTransform {
 public:
  // `range`: the shard's flat range; workers 0..num_workers-1.
  DelayCompensation(const DelayCompensationOptions& options, Segment range, int num_workers);

  // Worker w's pull of `segments` (flat, inside the range) was answered with the shard's
  // parameters `params` (the whole range) as they are now.
  void Pulled(int worker, std::span<const Segment> segments, std::span<const float> params) override;
  // Each chunk of worker w's push replaced by its corrected values (Correct, chunk by chunk, into
  // chunks of their own: the values as they came are let go), counted once.
  void Transform(int worker, HeldPush* push, std::span<const float> params) override;
  // Worker w's gradient `values` over `segments` (flat, in order) corrected into `out` (as many
  // values), against the shard's parameters now. False, and `out` the gradient as it came, when
  // worker w has not pulled from this shard yet. A push in parts is corrected part by part;
  // Counted counts it once.
  bool Correct(int worker, std::span<const Segment> segments, const float* values, std::span<const float> params,
               float* out);
  void Counted(bool corrected) { ++(corrected ? corrected_ : uncorrected_); }

  // The memory it holds: the workers' pulled parameters and the mean square.
  uint64_t bytes() const;
  int64_t corrected() const { return corrected_; }    // pushes (Counted)
  int64_t uncorrected() const { return uncorrected_; }
  // How much the corrections changed the gradients: sqrt(Σ(g' − g)² / Σg²) over every element
  // corrected so far (0 before any).
  double relative_correction() const;
  const DelayCompensationOptions& options() const { return options_; }

 private:
  // Adds Σg² and Σ(corrected − g)² of n elements to the totals.
  void AddSquares(const float* g, const float* corrected, int64_t n);

  DelayCompensationOptions options_;
  Segment range_;
  std::vector<std::vector<float>> pulled_;  // per worker: its last pull's values (empty: none yet)
  std::vector<float> mean_square_;          // adaptive: over the range
  int64_t corrected_ = 0, uncorrected_ = 0;
  double gradient_sq_ = 0, correction_sq_ = 0;  // Σg², Σ(g' − g)² over the corrected elements
};

// `t` as DelayCompensation (its counters and memory, for the server's log and summary), or null.
inline const DelayCompensation* AsDelayCompensation(const GradientTransform* t) {
  return dynamic_cast<const DelayCompensation*>(t);
}

}  // namespace gradsync
