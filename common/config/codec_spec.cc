#include "common/config/codec_spec.h"

#include <cmath>
#include <cstdlib>

namespace gradsync {
namespace {

enum class Param { kNone, kInteger, kRatio };

struct KindRow {
  CodecSpec::Kind kind;
  const char* name;
  Param param;
  double lo, hi;     // kInteger: the parameter's range
  const char* what;  // kInteger: the parameter, for the message
  bool payload, on_ps, on_device, needs_shapes;
};

constexpr KindRow kKinds[] = {
    {CodecSpec::Kind::kNone, "none", Param::kNone, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kFp16, "fp16", Param::kNone, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kBf16, "bf16", Param::kNone, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kInt8, "int8", Param::kNone, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kSign, "sign", Param::kNone, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kQsgd, "qsgd", Param::kInteger, 1, 127, "an integer number of levels in [1, 127], e.g. qsgd:16",
     true, true, true, false},
    {CodecSpec::Kind::kTopK, "topk", Param::kRatio, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kRandomK, "randomk", Param::kRatio, 0, 0, "", true, true, true, false},
    {CodecSpec::Kind::kPowerSgd, "powersgd", Param::kInteger, 1, 1024, "an integer rank in [1, 1024], e.g. powersgd:4",
     false, false, false, true},
};

const KindRow& RowOf(CodecSpec::Kind kind) {
  for (const KindRow& r : kKinds)
    if (r.kind == kind) return r;
  return kKinds[0];
}

}  // namespace

bool CodecSpec::payload() const { return RowOf(kind).payload; }
bool CodecSpec::on_ps() const { return RowOf(kind).on_ps; }
bool CodecSpec::on_device() const { return RowOf(kind).on_device; }
bool CodecSpec::needs_shapes() const { return RowOf(kind).needs_shapes; }

Result<CodecSpec> ParseCodecSpec(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  for (const KindRow& r : kKinds) {
    if (name != r.name) continue;
    CodecSpec out;
    out.kind = r.kind;
    if (r.param == Param::kNone) {
      if (colon != std::string::npos) return InvalidArgumentError("--compress=" + name + " takes no parameter");
      return out;
    }
    char* end = nullptr;
    const double v = std::strtod(arg.c_str(), &end);
    const bool number = !arg.empty() && *end == '\0' && std::isfinite(v);
    if (r.param == Param::kInteger && (!number || v != std::floor(v) || v < r.lo || v > r.hi)) {
      return InvalidArgumentError(name + " needs " + r.what + "; got '" + spec + "'");
    }
    if (r.param == Param::kRatio && (!number || v <= 0 || v > 1)) {
      return InvalidArgumentError(name + " needs a ratio in (0, 1], e.g. " + name + ":0.01; got '" + spec + "'");
    }
    out.param = v;
    return out;
  }
  return InvalidArgumentError("unknown compression '" + spec +
                              "' (expected none|fp16|bf16|int8|qsgd:LEVELS|sign|topk:RATIO|randomk:RATIO|powersgd:RANK)");
}

}  // namespace gradsync
