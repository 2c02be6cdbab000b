// The replication plane: what a shard's primary and its backups say to each other
// (replication.h), as typed messages with one encoder and one decoder each, used by both ends.
// On the wire an entry is a wire::Header (REPLICATE; its replica_* fields) and the key / value
// frames of common/net/transport.h; ARCHITECTURE.md, "Replication", describes them.
//
//   primary -> backup  ReplicaEntry  REPLICATE: one entry of shard `shard`'s log (a snapshot's
//                                    META, PARAMS and STATE, then each PUSH chunk, ROUND, CONTROL
//                                    change and OPTIMIZER vector), with the consistency state
//                                    after it
//   backup -> primary  ReplicaAck    REPLICATE_REPLY (the entry of that sequence number is held)
//                                    or ERROR (a Status: refused, or out of step)
//
// Decoding checks what a header alone can say is wrong (type, sender, the op, segments, a rate,
// a scale, part and state numbers) and answers kInvalidArgument; what depends on the copy (its
// shard, order, key, range) is the backup's to check.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/table/table_spec.h"
#include "gradsync.pb.h"

namespace gradsync {

// The primary's consistency state after an entry (WorkerClocks::Restore's arguments).
struct ReplicaControl {
  std::vector<int64_t> pushed;  // per worker: pushes counted
  std::vector<bool> live;       // per worker
  int64_t rounds = 0;           // rounds applied
};

// META: the snapshot a backup's copy starts from (checked by the backup before anything changes).
struct ReplicaMeta {
  std::string key;   // the job's replication key
  std::string meta;  // a serialized ShardCheckpoint without parameters and state
};

// PUSH: how the primary applied the chunk, so that the backup applies it alike.
struct ReplicaPush {
  float scale = 1.0f;            // the scale the primary applied the chunk with
  bool counts = false;           // the push's last chunk (it counts once this is applied)
  float lr = NAN;                // the rate the worker set (ROUND: the round's); NaN: the job's schedule
  std::vector<uint32_t> absent;  // tensors without a gradient
  std::vector<TableRun> tables;  // a chunk of table rows (the keys: their ids)
};

// STATE, OPTIMIZER: an optimizer state vector (wire::StateVector), or a worker's parameter set.
struct ReplicaState {
  int part = 0;           // the state vector this entry carries
  std::string optimizer;  // OPTIMIZER: the optimizer, its steps, per layer the steps skipped, its vectors
  int64_t steps = 0;
  std::vector<int64_t> skipped;
  int slots = 0;
  bool params = false;  // OPTIMIZER: a worker set the parameters (one entry, the range's values)
};

// The key / value frames that come with the entry: where the values go, and (decoded only) what
// the header announces of them.
struct ReplicaFrames {
  std::vector<Segment> segments;
  bool has_values = false;
  uint64_t num_keys = 0;
};

struct ReplicaEntry {
  int sender = 0;     // the sending server's rank (a META must come from the shard's own)
  int shard = 0;      // the shard copied
  wire::ReplicaOp op = wire::REPLICA_OP_UNSPECIFIED;
  uint64_t seq = 0;    // the primary's log position after this entry
  uint64_t index = 0;  // its position in what this backup was sent since its snapshot (META: 0)
  int worker = -1;     // PUSH, CONTROL (the worker that left; -1: none), OPTIMIZER (who set it)
  ReplicaMeta snapshot;
  ReplicaPush push;
  ReplicaState state;
  ReplicaFrames frames;
  std::optional<ReplicaControl> control;  // absent: the copy's rule stays as it is
};

// An acknowledgement: the entry of sequence number `seq` of shard `shard` is held (error OK), or
// it was refused with `error`.
struct ReplicaAck {
  int sender = 0;
  int shard = 0;
  uint64_t seq = 0;
  Status error;
};

wire::Header EncodeReplicaEntry(const ReplicaEntry& e);
Result<ReplicaEntry> DecodeReplicaEntry(const wire::Header& h);
wire::Header EncodeReplicaAck(const ReplicaAck& a);
// Fails on a message that is neither a REPLICATE_REPLY nor an ERROR (whoever answers on the
// primary's link to a backup's address speaks for that backup).
Result<ReplicaAck> DecodeReplicaAck(const wire::Header& h);

}  // namespace gradsync
