#include "common/optim/precision.h"

#include <algorithm>
#include <cfloat>

namespace gradsync {

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    default: return "fp32";
  }
}

Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return InvalidArgumentError("precision must be fp32, bf16 or fp16, not '" + name + "'");
}

std::optional<Float16> PrecisionFormat(Precision p) {
  if (p == Precision::kBf16) return Float16::kBfloat16;
  if (p == Precision::kFp16) return Float16::kHalf;
  return std::nullopt;
}

std::string PrecisionCodec(Precision p) {
  const auto f = PrecisionFormat(p);
  return f ? Float16Name(*f) : "";
}

bool DynamicLossScaler::Update(bool finite) {
  if (!finite) {
    ++skipped_;
    good_ = 0;
    scale_ = std::max(scale_ * options_.backoff, FLT_MIN);
    return false;
  }
  if (++good_ >= options_.growth_interval) {
    good_ = 0;
    scale_ = std::min(scale_ * options_.growth, FLT_MAX);
  }
  return true;
}

void DynamicLossScaler::Restore(float scale, int64_t good, int64_t skipped) {
  scale_ = scale;
  good_ = good;
  skipped_ = skipped;
}

}  // namespace gradsync
