// A worker's request header as a raw peer builds it, for tests that speak to a shard directly
// (hostile messages, CURVE probes): one segment [offset, offset + length). And a replication
// entry as shard `shard`'s primary would stamp it (no key, no payload).
#pragma once

#include <cstdint>

#include "gradsync.pb.h"

namespace gradsync::testing {

inline wire::Header WorkerRequest(wire::Type type, int rank, int64_t clock, uint64_t offset, uint64_t length) {
  wire::Header h;
  h.set_type(type);
  h.set_sender_role(wire::WORKER);
  h.set_sender_rank(rank);
  h.mutable_ps()->set_clock(clock);
  auto* seg = h.add_segments();
  seg->set_offset(offset);
  seg->set_length(length);
  return h;
}

inline wire::Header ReplicateEntry(int shard, wire::ReplicaOp op, uint64_t index) {
  wire::Header h;
  h.set_type(wire::REPLICATE);
  h.set_sender_role(wire::SERVER);
  h.set_sender_rank(shard);
  h.mutable_replica()->set_shard(shard);
  h.mutable_replica()->set_op(op);
  h.mutable_replica()->set_index(index);
  return h;
}

}  // namespace gradsync::testing
