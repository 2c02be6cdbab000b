// ConsistencyController: when a shard may apply a push and answer a pull, for bsp, ssp and asp.
// Pure logic over (worker, clock): no sockets, no threads, no time, so tests drive it directly.
//
// A worker's clock counts the gradients it has pushed. Its iteration c is: pull (with clock c),
// compute, push (clock c). Rules (ARCHITECTURE.md, Semantics; Ho et al. 2013):
//   bsp       pushes of round c are summed and applied once, when every live worker has pushed
//             it; a pull with clock c is answered once round c-1 is applied (rounds_applied >= c).
//   ssp(s>0)  pushes are applied as they arrive; a pull with clock c is answered once every live
//             worker has pushed at least c - s gradients. ssp(0) is bsp (same aggregation), as
//             s = 0 "behaves as bsp".
//   asp       pushes applied as they arrive; pulls never wait.
// A push must carry the worker's next clock (an old or future clock is kAborted); in bsp it must
// also be the current round. A pull must carry the worker's current clock. Dead workers leave the
// live set, so barriers and the minimum clock follow the live membership.
//
// Uneven inputs (workers that run different numbers of steps). A worker that ends training says
// so with its clock (EndAt). Ending alone changes nothing: it stays live, so a pull that needs a
// push of it past that clock can never be answered, and Blocker names it (the shard answers such
// a pull with BlockedError instead of holding it forever). A worker that leaves (Leave, a
// frontend's join()) is out of the rule as a dead worker is (bsp averages each round over the
// pushes it got, its push of the open round included), but it may still pull.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "train_config.pb.h"

namespace gradsync {

// The PS modes, as a shard's controller switches on them; named through common/config/train_config.h's
// one mode table (config::Mode), to which ToMode maps them.
enum class ConsistencyMode { kBsp, kSsp, kAsp };

Result<ConsistencyMode> ParseConsistencyMode(const std::string& text);
std::string ConsistencyModeName(ConsistencyMode mode);
config::Mode ToMode(ConsistencyMode mode);

class ConsistencyController {
 public:
  ConsistencyController(ConsistencyMode mode, int staleness, int num_workers);

  // True when pushes are summed per round and applied once (bsp, and ssp with s = 0).
  bool aggregates() const { return aggregate_; }

  // Whether worker w may push `clock` now (OnPush's checks, recording nothing).
  Status CheckPush(int worker, int64_t clock) const;
  // Records worker w's push with `clock`; errors leave the state unchanged.
  Status OnPush(int worker, int64_t clock);
  // Counts a push that CheckPush has accepted (a push in parts: checked part by part, counted
  // once with its last part).
  void CountPush(int worker) { ++pushed_[worker]; }
  // Checks a pull's clock without waiting.
  Status ValidatePull(int worker, int64_t clock) const;
  // Whether a (valid) pull with `clock` may be answered now (ssp with no live worker: yes).
  bool CanAnswerPull(int worker, int64_t clock) const;
  // The clock staleness of a pull with `clock` answered now: `clock` minus the lowest clock whose
  // updates the shard is guaranteed to hold (aggregating modes: the rounds applied; otherwise the
  // fewest gradients any live worker has pushed). At most the bound s whenever CanAnswerPull
  // holds in ssp, 0 in bsp, unbounded in asp; 0 when no worker is live (only one that left pulls:
  // every push is in).
  int64_t ClockStaleness(int64_t clock) const;

  // Aggregating modes: every live worker has pushed the current round (with none live: a worker
  // that left pushed it, so that its last push is applied all the same).
  bool RoundComplete() const;
  void OnRoundApplied() { ++rounds_applied_; }
  int64_t rounds_applied() const { return rounds_applied_; }

  // A dead worker: out of the live set (its pulls are refused).
  void RemoveWorker(int worker);
  // Worker w ended training after `clock` pushes (clock >= 0); it stays live unless it leaves.
  void EndAt(int worker, int64_t clock);
  // Worker w leaves the rule: not live for rounds and the minimum clock, but its pulls are
  // validated and answered as a live worker's (it pushes no more). Also for a worker already out
  // of the live set (a restored shard's state); never for a dead one (the caller's check).
  void Leave(int worker);
  bool HasLeft(int worker) const { return worker >= 0 && worker < num_workers() && left_[worker]; }
  // The clock worker w ended training at (EndAt), -1 while it has not.
  int64_t ended_at(int worker) const {
    return worker >= 0 && worker < num_workers() ? ended_[worker] : -1;
  }
  // The worker that makes a (valid) pull by `worker` with `clock` impossible, if any: a live
  // worker that ended at k (and did not leave) whose push the pull needs and will never come:
  // aggregating modes: the pull needs round clock-1, so k < clock (and the round is not applied);
  // ssp(s > 0): every live worker at >= clock - s, so k < clock - s; asp: never. Of several, the
  // one that ended first (then the lowest rank).
  std::optional<int> Blocker(int worker, int64_t clock) const;
  // The error (kFailedPrecondition) that answers such a pull: it names the blocker, its steps,
  // the step that waits for it and what to do.
  Status BlockedError(int64_t clock, int blocker) const;
  // Elastic membership and recovery: worker `worker` is live and goes on at `clock` (its next
  // push). A rejoining worker starts where the shard is (Suggest); a worker reconnecting to a
  // restored shard at the clock it has reached. Aggregating modes: rounds every live worker has
  // now passed count as applied (rounds a restored shard lost, or a rejoined worker skips).
  // A worker that was not live (a restarted one) starts afresh: neither ended nor left.
  void SetWorker(int worker, int64_t clock);
  // Where a (re)joining worker should start: the open round (aggregating modes), else the
  // smallest clock of the other live workers (so it holds no one back), else its own.
  int64_t Suggest(int worker) const;
  // Checkpoints: the whole state, and putting it back.
  const std::vector<int64_t>& pushed_all() const { return pushed_; }
  const std::vector<bool>& live_all() const { return live_; }
  Status Restore(std::vector<int64_t> pushed, std::vector<bool> live, int64_t rounds_applied);
  bool IsLive(int worker) const { return worker >= 0 && worker < num_workers() && live_[worker]; }
  int live_workers() const;
  int num_workers() const { return static_cast<int>(pushed_.size()); }
  int64_t pushed(int worker) const { return pushed_[worker]; }
  // The smallest clock among live workers (0 when none is live).
  int64_t min_live_clock() const;
  int staleness() const { return staleness_; }
  ConsistencyMode mode() const { return mode_; }

 private:
  // `pull`: a worker that left may still pull.
  Status CheckWorker(int worker, bool pull) const;

  ConsistencyMode mode_;
  int staleness_;
  bool aggregate_;
  std::vector<int64_t> pushed_;
  std::vector<bool> live_;
  std::vector<bool> left_;
  std::vector<int64_t> ended_;  // per worker: the clock it ended training at, -1 while it has not
  int64_t rounds_applied_ = 0;
};

// The advice that goes with every error about workers that ran different numbers of steps.
std::string UnevenStepsAdvice();
// How a mode names itself in those errors: "bsp", "ssp with staleness 2", "asp".
std::string ConsistencyRuleName(ConsistencyMode mode, int staleness);

}  // namespace gradsync
