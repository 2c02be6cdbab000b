// fp16 and bf16: each element as a 16-bit float, rounded to nearest even (common/base/numeric/half.h).
#include <cstring>

#include "common/base/numeric/half.h"
#include "compression/codecs/codecs.h"

namespace gradsync {
namespace {

class Float16Codec final : public Compressor {
 public:
  explicit Float16Codec(Float16 format) : format_(format) {}

  std::string name() const override { return Float16Name(format_); }
  Aggregation aggregation() const override { return Aggregation::kRingSummable; }
  std::optional<Float16> float16() const override { return format_; }
  size_t PayloadBytes(size_t n) const override { return 2 * n; }

  void Encode(ConstFloatSpan x, uint64_t, std::vector<uint8_t>* out) override {
    out->resize(2 * x.size());
    FloatsTo16(format_, x.data(), x.size(), reinterpret_cast<uint16_t*>(out->data()));
  }

  Status Decode(std::span<const uint8_t> p, size_t n, uint64_t, FloatSpan out) const override {
    if (p.size() != 2 * n || out.size() != n) {
      return DataLossError(name() + " payload has " + std::to_string(p.size()) + " bytes for " + std::to_string(n) +
                           " elements");
    }
    if (reinterpret_cast<uintptr_t>(p.data()) % alignof(uint16_t) == 0) {
      Float16sToFloats(format_, reinterpret_cast<const uint16_t*>(p.data()), n, out.data());
      return OkStatus();
    }
    std::vector<uint16_t> h(n);  // a payload at an odd address (a small ZeroMQ frame)
    std::memcpy(h.data(), p.data(), p.size());
    Float16sToFloats(format_, h.data(), n, out.data());
    return OkStatus();
  }

 private:
  Float16 format_;
};

}  // namespace

std::unique_ptr<Compressor> MakeFp16() { return std::make_unique<Float16Codec>(Float16::kHalf); }
std::unique_ptr<Compressor> MakeBf16() { return std::make_unique<Float16Codec>(Float16::kBfloat16); }

}  // namespace gradsync
