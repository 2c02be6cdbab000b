// Pushes as the shard holds them until they count, and the reassembly of pushes sent in parts.
//
// An overlapped push (PsRequest::parts > 1) arrives as numbered parts on the worker's
// connection, in order; it counts (consistency, version, its one reply) when its last part is
// in. Each part must belong to the push whose first part came (same clock, part count, version
// and rate), come in order, carry dense raw values or table rows only, and repeat no element of
// an earlier part. A push's table rows come in its last part (their room under the tables'
// bounds is checked as that part arrives, and taken as the push counts). After a bad part the rest of that push is dropped without a reply: the worker gets one
// answer per push and shard, the error. Pure bookkeeping: no sockets, no shard.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

// One message's share of a push: its segments and keys, and its values, kept without a copy
// where the channel they came through can lend them.
struct PushChunk {
  std::vector<Segment> segments;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> absent;  // tensors without a gradient (PsRequest::absent_tensors)
  std::vector<TableRun> tables;  // table rows: `keys` are their ids, the values their rows
  std::vector<float> owned;      // decoded, realigned, corrected or small values
  // Or where a channel lent them (a received ZeroMQ frame, a worker's shared-memory lane, a data
  // channel's frame buffer): `shared` points at them, `lease` holds them until the chunk goes.
  const float* shared = nullptr;
  std::shared_ptr<const float> lease;
  // Read where they are now (a chunk moves: into a round, a vector).
  const float* values() const { return shared != nullptr ? shared : owned.data(); }
};

// A push: one message, or the parts of an overlapped push.
struct HeldPush {
  std::vector<PushChunk> chunks;
  float lr = NAN;  // the worker's own rate for it (PsRequest::lr); NaN: the job's schedule
};

class PushAssembler {
 public:
  // Whether `part` is the rest of a push of `worker` whose earlier part failed (drop it quietly).
  bool IsRestOfFailed(int worker, const PsRequest& part) const;
  // Checks `part` (which carries `num_keys` keys) against the push it continues without taking
  // it (the shard's other checks come between Check and Add).
  Status Check(int worker, const PsRequest& part, size_t num_keys) const;
  // Takes a checked part: the whole push once its last part is in, else null. The push stays
  // here until Done or Forget.
  HeldPush* Add(int worker, const PsRequest& part, PushChunk chunk);
  // A part was refused: the rest of its push is dropped (IsRestOfFailed).
  void Failed(int worker, const PsRequest& part);
  // The push counted, or the worker left or skips ahead: forget what was held.
  void Forget(int worker) { partial_.erase(worker); }

 private:
  struct Partial {
    int64_t clock = 0;
    int64_t version = 0;
    int parts = 0;
    int next = 0;
    bool failed = false;
    HeldPush push;
    std::vector<Segment> covered;  // sorted by begin, disjoint
    std::vector<uint32_t> tables;  // the tables whose rows came
  };
  std::map<int, Partial> partial_;
};

}  // namespace gradsync
