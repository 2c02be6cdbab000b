#include "compression/pull_delta.h"

#include <cstring>

namespace gradsync {
namespace {
size_t Total(std::span<const Segment> segments) {
  size_t n = 0;
  for (const Segment& s : segments) n += static_cast<size_t>(s.size());
  return n;
}
}  // namespace

void PullDeltaEncoder::Record(int worker, std::span<const Segment> segments, const float* values) {
  Mirror& m = mirrors_[worker];
  m.values.resize(static_cast<size_t>(range_.size()));
  int64_t covered = 0;
  for (const Segment& s : segments) {
    std::memcpy(m.values.data() + (s.begin - range_.begin), values, static_cast<size_t>(s.size()) * sizeof(float));
    values += s.size();
    covered += s.size();
  }
  if (covered == range_.size()) m.complete = true;  // segments are disjoint and in range
}

Result<bool> PullDeltaEncoder::Encode(int worker, std::span<const Segment> segments, std::span<const float> current,
                                      int64_t clock, std::vector<uint8_t>* payload) {
  auto it = mirrors_.find(worker);
  if (it == mirrors_.end() || !it->second.complete) return false;
  float* mirror = it->second.values.data();
  const size_t n = Total(segments);
  delta_.resize(n);
  decoded_.resize(n);
  size_t pos = 0;
  for (const Segment& s : segments) {
    for (int64_t i = s.begin; i < s.end; ++i, ++pos) delta_[pos] = current[pos] - mirror[i - range_.begin];
  }
  const uint64_t step = PullCodecStep(clock);
  codec_->Encode(delta_, step, payload);
  // The worker adds exactly what it decodes; so does the mirror.
  RETURN_IF_ERROR(codec_->Decode(*payload, n, step, decoded_).WithContext("own pull payload"));
  pos = 0;
  for (const Segment& s : segments) {
    for (int64_t i = s.begin; i < s.end; ++i, ++pos) mirror[i - range_.begin] += decoded_[pos];
  }
  return true;
}

Status PullDeltaDecoder::AddTo(std::span<const uint8_t> payload, std::span<const Segment> segments, int64_t clock,
                               FloatSpan target) {
  const size_t n = Total(segments);
  decoded_.resize(n);
  RETURN_IF_ERROR(codec_->Decode(payload, n, PullCodecStep(clock), decoded_));
  size_t pos = 0;
  for (const Segment& s : segments) {
    float* dst = target.data() + s.begin;
    for (int64_t i = 0; i < s.size(); ++i) dst[i] += decoded_[pos++];
  }
  return OkStatus();
}

}  // namespace gradsync
