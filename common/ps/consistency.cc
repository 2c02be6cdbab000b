#include "common/ps/consistency.h"

#include <algorithm>
#include <limits>

#include "common/config/train_config.h"

namespace gradsync {

// The names are common/config/train_config.h's one mode table; a shard knows the three PS modes.
Result<ConsistencyMode> ParseConsistencyMode(const std::string& text) {
  auto mode = ParseMode(text);
  if (mode.ok() && *mode == config::BSP) return ConsistencyMode::kBsp;
  if (mode.ok() && *mode == config::SSP) return ConsistencyMode::kSsp;
  if (mode.ok() && *mode == config::ASP) return ConsistencyMode::kAsp;
  return InvalidArgumentError("mode must be bsp, ssp or asp, not '" + text + "'");
}

config::Mode ToMode(ConsistencyMode mode) {
  switch (mode) {
    case ConsistencyMode::kBsp: return config::BSP;
    case ConsistencyMode::kSsp: return config::SSP;
    case ConsistencyMode::kAsp: return config::ASP;
  }
  return config::MODE_UNSPECIFIED;
}

std::string ConsistencyModeName(ConsistencyMode mode) { return ModeName(ToMode(mode)); }

ConsistencyController::ConsistencyController(ConsistencyMode mode, int staleness, int num_workers)
    : mode_(mode),
      staleness_(staleness),
      aggregate_(mode == ConsistencyMode::kBsp || (mode == ConsistencyMode::kSsp && staleness == 0)),
      clocks_(num_workers) {}

std::string UnevenStepsAdvice() {
  return "the workers ran different numbers of steps; call gradsync.torch.join() on a worker that runs out of data "
         "(or give every worker the same number of steps)";
}

std::string ConsistencyRuleName(ConsistencyMode mode, int staleness) {
  if (mode == ConsistencyMode::kSsp) return "ssp with staleness " + std::to_string(staleness);
  return ConsistencyModeName(mode);
}

Status ConsistencyController::CheckWorker(int worker, bool pull) const {
  if (worker < 0 || worker >= clocks_.num_workers()) {
    return InvalidArgumentError("unknown worker " + std::to_string(worker) + " (the job has " +
                                std::to_string(clocks_.num_workers()) + ")");
  }
  if (clocks_.HasLeft(worker)) {
    if (pull) return OkStatus();
    return FailedPreconditionError("worker " + std::to_string(worker) + " left training (join) after " +
                                   std::to_string(clocks_.pushed(worker)) + " pushes; it pushes no more");
  }
  if (!clocks_.IsLive(worker)) return FailedPreconditionError("worker " + std::to_string(worker) + " was declared dead");
  return OkStatus();
}

Status ConsistencyController::OnPush(int worker, int64_t clock) {
  RETURN_IF_ERROR(CheckPush(worker, clock));
  clocks_.CountPush(worker);
  return OkStatus();
}

Status ConsistencyController::CheckPush(int worker, int64_t clock) const {
  RETURN_IF_ERROR(CheckWorker(worker, /*pull=*/false));
  const int64_t pushed = clocks_.pushed(worker);
  if (clock != pushed) {
    return AbortedError(std::string(clock < pushed ? "old" : "future") + " clock: push " +
                        std::to_string(clock) + " from worker " + std::to_string(worker) +
                        ", expected " + std::to_string(pushed));
  }
  if (aggregate_ && clock != clocks_.rounds_applied()) {
    return AbortedError("push for round " + std::to_string(clock) + " while round " +
                        std::to_string(clocks_.rounds_applied()) + " is open");
  }
  return OkStatus();
}

Status ConsistencyController::ValidatePull(int worker, int64_t clock) const {
  RETURN_IF_ERROR(CheckWorker(worker, /*pull=*/true));
  const int64_t pushed = clocks_.pushed(worker);
  if (clock != pushed) {
    return AbortedError(std::string(clock < pushed ? "old" : "future") + " clock: pull " +
                        std::to_string(clock) + " from worker " + std::to_string(worker) + " which has pushed " +
                        std::to_string(pushed));
  }
  return OkStatus();
}

bool ConsistencyController::CanAnswerPull(int /*worker*/, int64_t clock) const {
  if (aggregate_) return clocks_.rounds_applied() >= clock;
  if (mode_ == ConsistencyMode::kAsp) return true;
  if (clocks_.live_workers() == 0) return true;  // only a worker that left pulls: nobody to wait for
  return clocks_.min_live_clock() >= clock - staleness_;
}

int64_t ConsistencyController::ClockStaleness(int64_t clock) const {
  if (!aggregate_ && clocks_.live_workers() == 0) return 0;
  const int64_t complete = aggregate_ ? clocks_.rounds_applied() : clocks_.min_live_clock();
  return std::max<int64_t>(0, clock - complete);
}

bool ConsistencyController::RoundComplete() const {
  if (!aggregate_) return false;
  const int64_t rounds = clocks_.rounds_applied();
  bool any = false;
  for (int w = 0; w < clocks_.num_workers(); ++w) {
    if (!clocks_.IsLive(w)) continue;
    any = true;
    if (clocks_.pushed(w) <= rounds) return false;
  }
  if (any) return true;
  // Nobody live: the round a worker that left pushed into is complete (its push is the round's).
  for (int w = 0; w < clocks_.num_workers(); ++w)
    if (clocks_.HasLeft(w) && clocks_.pushed(w) > rounds) return true;
  return false;
}

std::optional<int> ConsistencyController::Blocker(int /*worker*/, int64_t clock) const {
  if (mode_ == ConsistencyMode::kAsp) return std::nullopt;
  if (aggregate_ && clocks_.rounds_applied() >= clock) return std::nullopt;
  // The pushes the pull needs of every live worker: round clock-1's (aggregating), or clock - s.
  const int64_t needed = aggregate_ ? clock : clock - staleness_;
  std::optional<int> blocker;
  for (int w = 0; w < clocks_.num_workers(); ++w) {
    const int64_t ended = clocks_.ended_at(w);
    if (!clocks_.IsLive(w) || ended < 0 || ended >= needed) continue;
    if (!blocker || ended < clocks_.ended_at(*blocker)) blocker = w;
  }
  return blocker;
}

Status ConsistencyController::BlockedError(int64_t clock, int blocker) const {
  const int64_t ended = clocks_.ended_at(blocker);
  const int64_t needed = aggregate_ ? clock : clock - staleness_;
  return FailedPreconditionError(
      "worker " + std::to_string(blocker) + " ended training after " + std::to_string(ended) +
      " steps, but this worker's step " + std::to_string(clock) + " needs its push of step " +
      std::to_string(needed - 1) + " (" + ConsistencyRuleName(mode_, staleness_) + "): " + UnevenStepsAdvice());
}

int64_t ConsistencyController::Suggest(int worker) const {
  if (aggregate_) return clocks_.rounds_applied();
  int64_t m = std::numeric_limits<int64_t>::max();
  for (int w = 0; w < clocks_.num_workers(); ++w)
    if (clocks_.IsLive(w) && w != worker) m = std::min(m, clocks_.pushed(w));
  if (m != std::numeric_limits<int64_t>::max()) return m;
  return worker >= 0 && worker < clocks_.num_workers() ? clocks_.pushed(worker) : 0;
}

}  // namespace gradsync
