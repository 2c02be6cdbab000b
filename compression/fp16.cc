// fp16: IEEE 754 binary16, round to nearest even (common/half.h).
#include <cstring>

#include "common/half.h"
#include "compression/codecs.h"

namespace gradsync {
namespace {

class Fp16 final : public Compressor {
 public:
  std::string name() const override { return "fp16"; }
  Aggregation aggregation() const override { return Aggregation::kRingSummable; }
  size_t PayloadBytes(size_t n) const override { return 2 * n; }

  void Encode(ConstFloatSpan x, uint64_t, std::vector<uint8_t>* out) override {
    out->resize(2 * x.size());
    FloatsToHalves(x.data(), x.size(), reinterpret_cast<uint16_t*>(out->data()));
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() != 2 * n || out.size() != n) {
      return DataLossError("fp16 payload has " + std::to_string(p.size()) + " bytes for " + std::to_string(n) + " elements");
    }
    if (reinterpret_cast<uintptr_t>(p.data()) % alignof(uint16_t) == 0) {
      HalvesToFloats(reinterpret_cast<const uint16_t*>(p.data()), n, out.data());
      return OkStatus();
    }
    std::vector<uint16_t> h(n);  // a payload at an odd address (a small ZeroMQ frame)
    std::memcpy(h.data(), p.data(), p.size());
    HalvesToFloats(h.data(), n, out.data());
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Compressor> MakeFp16() { return std::make_unique<Fp16>(); }

}  // namespace gradsync
