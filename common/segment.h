// Segment: a contiguous run [begin, end) of the flat parameter space. It is a shard's range
// (Partitioner), a run of dense tensors, and a message's segment once decoded from the wire
// (common/ps_protocol.h turns wire::Segment's offset/length into one, checked).
#pragma once

#include <cstdint>

namespace gradsync {

struct Segment {
  int64_t begin = 0;  // first flat element
  int64_t end = 0;    // one past the last
  int64_t size() const { return end - begin; }
  bool operator==(const Segment&) const = default;
};

}  // namespace gradsync
