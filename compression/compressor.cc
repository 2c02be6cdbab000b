#include "compression/compressor.h"

#include <cmath>
#include <cstring>

#include "common/config/train_config.h"
#include "compression/codecs/codecs.h"

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
  ASSIGN_OR_RETURN(CodecSpec codec, ParseCodecSpec(spec));  // the syntax is common/config/train_config.h's
  switch (codec.kind) {
    case CodecSpec::Kind::kNone: return std::unique_ptr<Compressor>();
    case CodecSpec::Kind::kFp16: return MakeFp16();
    case CodecSpec::Kind::kBf16: return MakeBf16();
    case CodecSpec::Kind::kInt8: return MakeInt8();
    case CodecSpec::Kind::kSign: return MakeSign();
    case CodecSpec::Kind::kQsgd: return MakeQsgd(static_cast<int>(codec.param), seed);
    case CodecSpec::Kind::kTopK: return MakeTopK(codec.param);
    case CodecSpec::Kind::kRandomK: return MakeRandomK(codec.param, seed, unbiased_randomk);
    case CodecSpec::Kind::kPowerSgd:
      return InvalidArgumentError("powersgd:R is not a payload codec: it compresses whole matrices into factors that "
                                  "two all-reduces average (compression/powersgd.h; mode allreduce)");
  }
  return InternalError("unhandled codec '" + spec + "'");
}

}  // namespace gradsync
