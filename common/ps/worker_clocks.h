// WorkerClocks: the bookkeeping a shard's consistency rule decides over, per worker: the pushes
// it has counted (its clock), whether it is live, whether it left (join), the clock it ended
// training at; and the rounds applied. It records and answers; it decides nothing: what a push,
// a pull or a round may do is ConsistencyController's (consistency.h).
//
// The live set: a dead worker (RemoveWorker) is out of it, and so is a worker that left (Leave),
// which may still pull; a worker set to go on at a clock (SetWorker) is in it again. The
// checkpoint of a shard holds every clock, the live set and the rounds (pushed_all, live_all,
// Restore).
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

class WorkerClocks {
 public:
  explicit WorkerClocks(int num_workers);

  int num_workers() const { return static_cast<int>(pushed_.size()); }
  // Worker w's clock: the pushes counted of it.
  int64_t pushed(int worker) const { return pushed_[worker]; }
  // Counts a push of worker w (the rule has accepted it).
  void CountPush(int worker) { ++pushed_[worker]; }
  void OnRoundApplied() { ++rounds_applied_; }
  int64_t rounds_applied() const { return rounds_applied_; }

  bool IsLive(int worker) const { return worker >= 0 && worker < num_workers() && live_[worker]; }
  bool HasLeft(int worker) const { return worker >= 0 && worker < num_workers() && left_[worker]; }
  // The clock worker w ended training at (EndAt), -1 while it has not.
  int64_t ended_at(int worker) const {
    return worker >= 0 && worker < num_workers() ? ended_[worker] : -1;
  }
  int live_workers() const;
  // The smallest clock among live workers (0 when none is live).
  int64_t min_live_clock() const;

  // A dead worker: out of the live set (its pulls are refused).
  void RemoveWorker(int worker);
  // Worker w ended training after `clock` pushes (clock >= 0); it stays live unless it leaves.
  void EndAt(int worker, int64_t clock);
  // Worker w leaves the rule: not live for rounds and the minimum clock, but its pulls are
  // validated and answered as a live worker's (it pushes no more). Also for a worker already out
  // of the live set (a restored shard's state); never for a dead one (the caller's check).
  void Leave(int worker);
  // Elastic membership and recovery: worker `worker` is live and goes on at `clock` (its next
  // push). A rejoining worker starts where the shard is (ConsistencyController::Suggest); a
  // worker reconnecting to a restored shard at the clock it has reached. Aggregating modes:
  // rounds every live worker has now passed count as applied (rounds a restored shard lost, or a
  // rejoined worker skips). A worker that was not live (a restarted one) starts afresh: neither
  // ended nor left.
  void SetWorker(int worker, int64_t clock);

  // Checkpoints: the whole state, and putting it back.
  const std::vector<int64_t>& pushed_all() const { return pushed_; }
  const std::vector<bool>& live_all() const { return live_; }
  Status Restore(std::vector<int64_t> pushed, std::vector<bool> live, int64_t rounds_applied);

 private:
  std::vector<int64_t> pushed_;
  std::vector<bool> live_;
  std::vector<bool> left_;
  std::vector<int64_t> ended_;  // per worker: the clock it ended training at, -1 while it has not
  int64_t rounds_applied_ = 0;
};

}  // namespace gradsync
