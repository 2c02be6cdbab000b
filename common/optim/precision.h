// Training precision (--precision) and dynamic loss scaling.
//
// fp32: every operand and gradient in float. bf16 | fp16: the models compute with 16-bit
// operands and fp32 accumulation (the GEMMs' inputs, the activations and the activation
// gradients are 16-bit values; the master weights, the optimizer state and every update stay
// fp32), and gradients travel in 16 bits on every path (the ring, NCCL, PS pushes). bf16 has
// float's range, so it needs no loss scaling; fp16's largest value is 65504 and its smallest
// normal 6.1e-5, so fp16 runs scale the loss (and with it every gradient) by S before backward
// and divide by S before the update: DynamicLossScaler below.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/base/numeric/half.h"
#include "common/base/status.h"

namespace gradsync {

enum class Precision { kFp32, kBf16, kFp16 };

const char* PrecisionName(Precision p);                   // "fp32" | "bf16" | "fp16"
Result<Precision> ParsePrecision(const std::string& name);
// The 16-bit format of a 16-bit precision; nullopt for fp32.
std::optional<Float16> PrecisionFormat(Precision p);
// The gradient codec a precision implies where the job names none: "fp16" | "bf16" | "".
std::string PrecisionCodec(Precision p);

// Dynamic loss scaling as torch.cuda.amp.GradScaler does it: start at `initial`; a step whose
// (scaled) gradients hold an inf or NaN is skipped and the scale multiplied by `backoff`; after
// `growth_interval` good steps in a row the scale is multiplied by `growth`. Every rank of an
// all-reduce sees the same reduced gradient, so every rank makes the same decision. Not
// thread-safe.
class DynamicLossScaler {
 public:
  struct Options {
    float initial = 65536.0f;  // 2^16, GradScaler's default
    float growth = 2.0f;
    float backoff = 0.5f;
    int64_t growth_interval = 2000;
  };
  DynamicLossScaler() : DynamicLossScaler(Options{}) {}
  explicit DynamicLossScaler(const Options& options) : options_(options), scale_(options.initial) {}

  float scale() const { return scale_; }
  // Records one step: finite = the step's gradients were all finite (it is applied). Returns
  // whether the step is applied.
  bool Update(bool finite);
  int64_t skipped() const { return skipped_; }
  int64_t good_in_a_row() const { return good_; }
  // For checkpoints: puts back a scale and counters.
  void Restore(float scale, int64_t good, int64_t skipped);

 private:
  Options options_;
  float scale_;
  int64_t good_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace gradsync
