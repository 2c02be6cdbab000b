#include "common/config/straggler.h"

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "common/base/clock.h"

namespace gradsync {
double Straggler::DelayMs(double compute_ms) {
  switch (spec_.kind) {
    case StragglerSpec::Kind::kNone: return 0;
    case StragglerSpec::Kind::kFixed: return spec_.a;
    case StragglerSpec::Kind::kMultiple: return (spec_.a - 1) * std::max(0.0, compute_ms);
    case StragglerSpec::Kind::kExponential: return -spec_.a * std::log1p(-rng_.UniformDouble());
    case StragglerSpec::Kind::kUniform: return spec_.a + (spec_.b - spec_.a) * rng_.UniformDouble();
  }
  return 0;
}

double Straggler::Sleep(double compute_ms) {
  const double ms = DelayMs(compute_ms);
  if (ms <= 0) return 0;
  Stopwatch slept;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  return slept.Millis();
}

}  // namespace gradsync
