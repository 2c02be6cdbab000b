// A worker's request header as a raw peer builds it, for tests that speak to a shard directly
// (hostile messages, CURVE probes): one segment [offset, offset + length).
#pragma once

#include <cstdint>

#include "gradsync.pb.h"

namespace gradsync::testing {

inline wire::Header WorkerRequest(wire::Type type, int rank, int64_t clock, uint64_t offset, uint64_t length) {
  wire::Header h;
  h.set_type(type);
  h.set_sender_role(wire::WORKER);
  h.set_sender_rank(rank);
  h.set_clock(clock);
  auto* seg = h.add_segments();
  seg->set_offset(offset);
  seg->set_length(length);
  return h;
}

}  // namespace gradsync::testing
