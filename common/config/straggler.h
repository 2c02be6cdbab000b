// Stragglers: an injected delay per training step, so that experiments can slow one worker down
// in a controlled, reproducible way (gradsync-worker --straggle=SPEC --straggle-seed=S).
//
//   none          no delay
//   ms:D          D milliseconds every step
//   x:F           the step's compute takes F times as long: (F - 1) * compute_ms (F >= 1)
//   exp:M         exponentially distributed, mean M ms, seeded
//   uniform:A:B   uniform in [A, B] ms, seeded
//
// The delay is slept right after the step's compute (before its push or all-reduce) and reported
// in the metrics rows (delay_ms), so it is never mistaken for compute or communication time.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/numeric/rng.h"
#include "common/base/status.h"
#include "common/config/train_config.h"

namespace gradsync {

// StragglerSpec and ParseStraggler (the syntax above) are common/config/train_config.h's.

class Straggler {
 public:
  Straggler() = default;
  Straggler(const StragglerSpec& spec, uint64_t seed) : spec_(spec), rng_(seed) {}

  bool active() const { return spec_.kind != StragglerSpec::Kind::kNone; }
  // The delay for a step whose compute took compute_ms (draws from the seeded stream).
  double DelayMs(double compute_ms);
  // Sleeps DelayMs(compute_ms) and returns the milliseconds actually slept.
  double Sleep(double compute_ms);

 private:
  StragglerSpec spec_;
  Rng rng_{0};
};

}  // namespace gradsync
