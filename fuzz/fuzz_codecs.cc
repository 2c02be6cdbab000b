// fuzz_codecs: every compression codec's Decode on arbitrary bytes, and Encode -> Decode on
// arbitrary floats.
//
// Input (FuzzedDataProvider): codec index, mode, element count n (<= 1 << 16, or derived from
// the payload's length so that the size checks pass and the decoder's body runs), step, then
// the payload (decode mode) or the floats (round-trip mode).
//
// What must hold (compression/compressor.h): Decode never crashes, never reads past the
// payload, allocates at most O(n), and when it returns OK it has written all n outputs. A
// payload that Encode wrote for finite values of sane magnitude decodes OK, to a vector of
// n floats whose non-zeros a sparsifier kept.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compression/compressor.h"

namespace {

using gradsync::Compressor;

constexpr size_t kMaxElements = size_t{1} << 16;
// A bit pattern no dense codec (fp16, int8, qsgd, sign) decodes to: a signalling NaN.
constexpr uint32_t kUnwritten = 0x7fa5a5a5u;

struct Codec {
  const char* spec;
  bool copies_floats;  // top-k / random-k carry raw fp32 values (any bit pattern)
};
constexpr Codec kCodecs[] = {
    {"fp16", false},   {"int8", false},          {"qsgd:4", false},         {"qsgd:16", false},
    {"sign", false},   {"topk:0.01", true},      {"randomk:0.01", true},    {"topk:0.5", true},
    {"randomk:1", true},
};
constexpr size_t kNumCodecs = sizeof(kCodecs) / sizeof(kCodecs[0]);

// FUZZ_VERBOSE=1: one line per input (what it decoded and how that went), to read a crasher.
bool Verbose() {
  static const bool v = std::getenv("FUZZ_VERBOSE") != nullptr;
  return v;
}

[[noreturn]] void Fail(const char* spec, const std::string& what) {
  std::fprintf(stderr, "fuzz_codecs: %s: %s\n", spec, what.c_str());
  std::abort();
}

std::vector<std::unique_ptr<Compressor>>& Codecs() {
  static auto* codecs = [] {
    auto* v = new std::vector<std::unique_ptr<Compressor>>();
    for (const auto& c : kCodecs) {
      auto r = gradsync::CreateCompressor(c.spec, /*seed=*/7);
      if (!r.ok() || !*r) Fail(c.spec, "CreateCompressor failed");
      v->push_back(std::move(*r));
    }
    return v;
  }();
  return *codecs;
}

// The smallest n whose payload is at least `bytes` long (PayloadBytes is non-decreasing in n).
size_t ElementsForPayload(const Compressor& c, size_t bytes) {
  size_t lo = 0, hi = kMaxElements;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (c.PayloadBytes(mid) < bytes) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void DecodeArbitrary(const Codec& spec, Compressor& c, FuzzedDataProvider& in) {
  const int how_n = in.ConsumeIntegralInRange<int>(0, 3);
  size_t n = in.ConsumeIntegralInRange<size_t>(0, kMaxElements);
  const uint64_t step = in.ConsumeIntegral<uint64_t>();
  const std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
  if (how_n > 0) {
    // Mostly: n such that the payload has the right length (give or take one element).
    n = ElementsForPayload(c, bytes.size());
    if (how_n == 2 && n > 0) --n;
    if (how_n == 3 && n < kMaxElements) ++n;
  }
  // The payload in a buffer of exactly its size, so that ASan sees any read past it.
  std::unique_ptr<uint8_t[]> payload(new uint8_t[bytes.size() + 1]);
  if (!bytes.empty()) std::memcpy(payload.get(), bytes.data(), bytes.size());
  std::vector<float> out(n);
  for (auto& v : out) std::memcpy(&v, &kUnwritten, 4);
  const gradsync::Status s = c.Decode(std::span<const uint8_t>(payload.get(), bytes.size()), n, step, out);
  if (Verbose()) std::fprintf(stderr, "decode %s n=%zu bytes=%zu: %s\n", spec.spec, n, bytes.size(), s.ToString().c_str());
  if (!s.ok()) {
    if (s.code() != gradsync::StatusCode::kDataLoss) Fail(spec.spec, "Decode failed without kDataLoss: " + s.message());
    return;
  }
  if (bytes.size() != c.PayloadBytes(n)) {
    Fail(spec.spec, "Decode accepted " + std::to_string(bytes.size()) + " bytes for n = " + std::to_string(n) +
                        "; PayloadBytes is " + std::to_string(c.PayloadBytes(n)));
  }
  if (!spec.copies_floats) {
    for (size_t i = 0; i < n; ++i) {
      if (Bits(out[i]) == kUnwritten) Fail(spec.spec, "Decode returned OK but left element " + std::to_string(i) + " unwritten");
    }
  }
}

void RoundTrip(const Codec& spec, Compressor& c, FuzzedDataProvider& in) {
  const uint64_t step = in.ConsumeIntegral<uint64_t>();
  const bool sane = in.ConsumeBool();  // clamp into a magnitude every codec must handle
  const size_t n = std::min(kMaxElements, in.remaining_bytes() / 4);
  std::vector<float> x(n);
  const std::vector<uint8_t> raw = in.ConsumeBytes<uint8_t>(4 * n);
  if (n > 0) std::memcpy(x.data(), raw.data(), 4 * n);
  bool finite = true;
  for (auto& v : x) {
    if (sane) v = std::isfinite(v) ? std::fmax(-1e18f, std::fmin(1e18f, v)) : 0.0f;
    finite = finite && std::isfinite(v) && std::fabs(v) <= 1e18f;
  }
  std::vector<uint8_t> payload;
  c.Encode(x, step, &payload);
  if (payload.size() != c.PayloadBytes(n)) {
    Fail(spec.spec, "Encode wrote " + std::to_string(payload.size()) + " bytes for n = " + std::to_string(n) +
                        "; PayloadBytes is " + std::to_string(c.PayloadBytes(n)));
  }
  std::vector<float> out(n);
  const gradsync::Status s = c.Decode(payload, n, step, out);
  if (Verbose()) std::fprintf(stderr, "round trip %s n=%zu finite=%d: %s\n", spec.spec, n, finite, s.ToString().c_str());
  if (!s.ok()) {
    if (finite) Fail(spec.spec, "a payload Encode wrote for finite values does not decode: " + s.message());
    return;
  }
  if (c.sparse() && finite) {
    // Every non-zero decoded value is one of the inputs at its index (top-k; random-k here is
    // not scaled), and there are at most PayloadBytes-many of them.
    for (size_t i = 0; i < n; ++i) {
      if (out[i] != 0.0f && Bits(out[i]) != Bits(x[i])) {
        Fail(spec.spec, "decoded element " + std::to_string(i) + " is not the input's value");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const size_t which = in.ConsumeIntegralInRange<size_t>(0, kNumCodecs - 1);
  const bool round_trip = in.ConsumeBool();
  Compressor& c = *Codecs()[which];
  if (round_trip) RoundTrip(kCodecs[which], c, in);
  else DecodeArbitrary(kCodecs[which], c, in);
  return 0;
}
