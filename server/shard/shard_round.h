// ShardRound: where a counted push goes. In the aggregating modes (bsp, ssp with s = 0) it is
// held for the open round, its values where they came (a frame, a shared-memory lane, a data
// channel's buffer), and the round is applied at once: the held pushes summed in worker-rank order
// (so that a bsp run is bit-for-bit reproducible whatever order they came in), each push's values
// let go as soon as they have been read, and their mean applied once. In the other modes a push
// is applied to the shard at once, chunk by chunk, and let go. Also the round's traces (what the
// round waited for, its apply).
#pragma once

#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "common/obs/trace.h"

#include "server/shard/kv/kv_shard.h"
#include "server/shard/push_assembler.h"

namespace gradsync {

// A round as it was applied.
struct AppliedRound {
  int pushes = 0;
  float lr = NAN;  // the pushes' own rate (they agree in bsp; else the highest rank's); NaN: the schedule's
};

class ShardRound {
 public:
  explicit ShardRound(bool aggregates) : aggregates_(aggregates) {}

  // Worker w's counted push: held for the round, or applied to `shard` now at `scale` (the
  // staleness-aware factor) and let go.
  void Take(int worker, HeldPush push, float scale, KvShard& shard);
  // One chunk of a push, as a backup's log carries them: held (the push's chunks gather in
  // order, `lr` the push's rate) or applied to `shard` now (`counts`: its last chunk).
  void TakeChunk(int worker, PushChunk chunk, float scale, bool counts, float lr, KvShard& shard);
  // Applies the open round to `shard` (round number `round`; `waited_for`: the worker counted
  // last, for the trace) and empties it. `span`: the round's trace span, open until the caller
  // has announced the round too.
  AppliedRound Apply(KvShard& shard, int64_t round, int waited_for, std::optional<TraceSpan>* span);

  // Worker w's held push goes (a round it skips).
  void Drop(int worker) { held_.erase(worker); }
  // The open round's pushes (worker -> push), and putting those of a backup's copy back.
  const std::map<int, HeldPush>& held() const { return held_; }
  void SetHeld(std::map<int, HeldPush> held) { held_ = std::move(held); }
  std::map<int, HeldPush> TakeHeld() { return std::exchange(held_, {}); }
  // Nothing held (the shard rebuilt or reset).
  void Clear();
  // Whether the rounds go into the process's trace (a backup's copies do not).
  void set_traced(bool on) { traced_ = on; }

 private:
  bool aggregates_;
  std::map<int, HeldPush> held_;  // worker -> its push of the open round
  double open_us_ = -1;           // traces: when the open round's first push was held (-1: none)
  bool traced_ = true;
};

}  // namespace gradsync
