#include "compression/compressor.h"

#include <cmath>
#include <cstring>

#include "compression/codecs.h"

namespace gradsync {

size_t KeptElements(size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::round(ratio * static_cast<double>(n));
  return std::min(n, std::max<size_t>(1, static_cast<size_t>(k)));
}

namespace payload {
void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  out->insert(out->end(), b, b + 4);
}
void PutF32(std::vector<uint8_t>* out, float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  PutU32(out, u);
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float GetF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace payload

Result<std::unique_ptr<Compressor>> CreateCompressor(const std::string& spec, uint64_t seed, bool unbiased_randomk) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto number = [&](double* v) {
    char* end = nullptr;
    *v = std::strtod(arg.c_str(), &end);
    return !arg.empty() && *end == '\0' && std::isfinite(*v);
  };
  auto no_arg = [&]() -> Status {
    if (colon != std::string::npos) return InvalidArgumentError("--compress=" + name + " takes no parameter");
    return OkStatus();
  };
  double v = 0;
  if (name == "none") {
    RETURN_IF_ERROR(no_arg());
    return std::unique_ptr<Compressor>();
  }
  if (name == "fp16") {
    RETURN_IF_ERROR(no_arg());
    return MakeFp16();
  }
  if (name == "int8") {
    RETURN_IF_ERROR(no_arg());
    return MakeInt8();
  }
  if (name == "sign") {
    RETURN_IF_ERROR(no_arg());
    return MakeSign();
  }
  if (name == "qsgd") {
    if (!number(&v) || v != std::floor(v) || v < 1 || v > 127) {
      return InvalidArgumentError("qsgd needs an integer number of levels in [1, 127], e.g. qsgd:16; got '" + spec + "'");
    }
    return MakeQsgd(static_cast<int>(v), seed);
  }
  if (name == "topk" || name == "randomk") {
    if (!number(&v) || v <= 0 || v > 1) {
      return InvalidArgumentError(name + " needs a ratio in (0, 1], e.g. " + name + ":0.01; got '" + spec + "'");
    }
    if (name == "topk") return MakeTopK(v);
    return MakeRandomK(v, seed, unbiased_randomk);
  }
  return InvalidArgumentError("unknown compression '" + spec + "' (expected none|fp16|int8|qsgd:LEVELS|sign|topk:RATIO|randomk:RATIO)");
}

}  // namespace gradsync
