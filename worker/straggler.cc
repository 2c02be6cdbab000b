#include "worker/straggler.h"

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace gradsync {
namespace {

Result<double> Number(const std::string& s, const std::string& spec) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v) && v >= 0) return v;
  } catch (const std::exception&) {
  }
  return InvalidArgumentError("straggler '" + spec + "': '" + s + "' is not a number >= 0");
}

}  // namespace

Result<StragglerSpec> ParseStraggler(const std::string& spec) {
  StragglerSpec out;
  if (spec.empty() || spec == "none") return out;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  const std::string& kind = parts[0];
  const size_t want = kind == "uniform" ? 3 : 2;
  if ((kind != "ms" && kind != "x" && kind != "exp" && kind != "uniform") || parts.size() != want) {
    return InvalidArgumentError("straggler '" + spec + "': expected none | ms:D | x:F | exp:MEAN | uniform:LO:HI");
  }
  ASSIGN_OR_RETURN(out.a, Number(parts[1], spec));
  if (kind == "ms") out.kind = StragglerSpec::Kind::kFixed;
  if (kind == "exp") out.kind = StragglerSpec::Kind::kExponential;
  if (kind == "x") {
    out.kind = StragglerSpec::Kind::kMultiple;
    if (out.a < 1) return InvalidArgumentError("straggler '" + spec + "': the factor must be >= 1");
  }
  if (kind == "uniform") {
    out.kind = StragglerSpec::Kind::kUniform;
    ASSIGN_OR_RETURN(out.b, Number(parts[2], spec));
    if (out.b < out.a) return InvalidArgumentError("straggler '" + spec + "': LO must not exceed HI");
  }
  if (out.a > 1e6 || out.b > 1e6) return InvalidArgumentError("straggler '" + spec + "': more than 1000 s per step");
  return out;
}

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
