// Segment: a contiguous run [begin, end) of the flat parameter space. It is a shard's range
// (Partitioner), a run of dense tensors, and a message's segment once decoded from the wire
// (common/ps/ps_protocol.h turns wire::Segment's offset/length into one, checked).
#pragma once

#include <cstdint>
#include <span>

namespace gradsync {

struct Segment {
  int64_t begin = 0;  // first flat element
  int64_t end = 0;    // one past the last
  int64_t size() const { return end - begin; }
  bool operator==(const Segment&) const = default;
};

// Whether `segments` are one run without gaps, each starting where the one before ends (a push
// through a lane or a data channel must be).
inline bool Contiguous(std::span<const Segment> segments) {
  for (size_t i = 1; i < segments.size(); ++i)
    if (segments[i].begin != segments[i - 1].end) return false;
  return true;
}

}  // namespace gradsync
