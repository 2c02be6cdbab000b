// ConsistencyController: when a shard may apply a push and answer a pull, for bsp, ssp and asp:
// the rule, deciding over the workers' clocks it holds (WorkerClocks, worker_clocks.h: the
// pushes counted, the live set, the rounds applied; what a dead, ended or leaving worker is).
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
#include "common/ps/worker_clocks.h"
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

  // The workers' clocks, live set and rounds this rule decides over (worker_clocks.h).
  const WorkerClocks& clocks() const { return clocks_; }
  WorkerClocks& clocks() { return clocks_; }

  // True when pushes are summed per round and applied once (bsp, and ssp with s = 0).
  bool aggregates() const { return aggregate_; }

  // Whether worker w may push `clock` now (OnPush's checks, recording nothing).
  Status CheckPush(int worker, int64_t clock) const;
  // Records worker w's push with `clock`; errors leave the state unchanged. A push that
  // CheckPush has accepted is counted with clocks().CountPush (a push in parts: checked part by
  // part, counted once with its last part).
  Status OnPush(int worker, int64_t clock);
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

  // The worker that makes a (valid) pull by `worker` with `clock` impossible, if any: a live
  // worker that ended at k (and did not leave) whose push the pull needs and will never come:
  // aggregating modes: the pull needs round clock-1, so k < clock (and the round is not applied);
  // ssp(s > 0): every live worker at >= clock - s, so k < clock - s; asp: never. Of several, the
  // one that ended first (then the lowest rank).
  std::optional<int> Blocker(int worker, int64_t clock) const;
  // The error (kFailedPrecondition) that answers such a pull: it names the blocker, its steps,
  // the step that waits for it and what to do.
  Status BlockedError(int64_t clock, int blocker) const;
  // Where a (re)joining worker should start: the open round (aggregating modes), else the
  // smallest clock of the other live workers (so it holds no one back), else its own.
  int64_t Suggest(int worker) const;
  int staleness() const { return staleness_; }
  ConsistencyMode mode() const { return mode_; }

 private:
  // `pull`: a worker that left may still pull.
  Status CheckWorker(int worker, bool pull) const;

  ConsistencyMode mode_;
  int staleness_;
  bool aggregate_;
  WorkerClocks clocks_;
};

// The advice that goes with every error about workers that ran different numbers of steps.
std::string UnevenStepsAdvice();
// How a mode names itself in those errors: "bsp", "ssp with staleness 2", "asp".
std::string ConsistencyRuleName(ConsistencyMode mode, int staleness);

}  // namespace gradsync
