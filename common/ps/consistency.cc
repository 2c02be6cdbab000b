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
      pushed_(static_cast<size_t>(num_workers), 0),
      live_(static_cast<size_t>(num_workers), true),
      left_(static_cast<size_t>(num_workers), false),
      ended_(static_cast<size_t>(num_workers), -1) {}

std::string UnevenStepsAdvice() {
  return "the workers ran different numbers of steps; call gradsync.torch.join() on a worker that runs out of data "
         "(or give every worker the same number of steps)";
}

std::string ConsistencyRuleName(ConsistencyMode mode, int staleness) {
  if (mode == ConsistencyMode::kSsp) return "ssp with staleness " + std::to_string(staleness);
  return ConsistencyModeName(mode);
}

Status ConsistencyController::CheckWorker(int worker, bool pull) const {
  if (worker < 0 || worker >= num_workers()) {
    return InvalidArgumentError("unknown worker " + std::to_string(worker) + " (the job has " +
                                std::to_string(num_workers()) + ")");
  }
  if (left_[worker]) {
    if (pull) return OkStatus();
    return FailedPreconditionError("worker " + std::to_string(worker) + " left training (join) after " +
                                   std::to_string(pushed_[worker]) + " pushes; it pushes no more");
  }
  if (!live_[worker]) return FailedPreconditionError("worker " + std::to_string(worker) + " was declared dead");
  return OkStatus();
}

Status ConsistencyController::OnPush(int worker, int64_t clock) {
  RETURN_IF_ERROR(CheckPush(worker, clock));
  ++pushed_[worker];
  return OkStatus();
}

Status ConsistencyController::CheckPush(int worker, int64_t clock) const {
  RETURN_IF_ERROR(CheckWorker(worker, /*pull=*/false));
  if (clock != pushed_[worker]) {
    return AbortedError(std::string(clock < pushed_[worker] ? "old" : "future") + " clock: push " +
                        std::to_string(clock) + " from worker " + std::to_string(worker) +
                        ", expected " + std::to_string(pushed_[worker]));
  }
  if (aggregate_ && clock != rounds_applied_) {
    return AbortedError("push for round " + std::to_string(clock) + " while round " +
                        std::to_string(rounds_applied_) + " is open");
  }
  return OkStatus();
}

Status ConsistencyController::ValidatePull(int worker, int64_t clock) const {
  RETURN_IF_ERROR(CheckWorker(worker, /*pull=*/true));
  if (clock != pushed_[worker]) {
    return AbortedError(std::string(clock < pushed_[worker] ? "old" : "future") + " clock: pull " +
                        std::to_string(clock) + " from worker " + std::to_string(worker) + " which has pushed " +
                        std::to_string(pushed_[worker]));
  }
  return OkStatus();
}

bool ConsistencyController::CanAnswerPull(int /*worker*/, int64_t clock) const {
  if (aggregate_) return rounds_applied_ >= clock;
  if (mode_ == ConsistencyMode::kAsp) return true;
  if (live_workers() == 0) return true;  // only a worker that left pulls: nobody to wait for
  return min_live_clock() >= clock - staleness_;
}

int64_t ConsistencyController::ClockStaleness(int64_t clock) const {
  if (!aggregate_ && live_workers() == 0) return 0;
  const int64_t complete = aggregate_ ? rounds_applied_ : min_live_clock();
  return std::max<int64_t>(0, clock - complete);
}

bool ConsistencyController::RoundComplete() const {
  if (!aggregate_) return false;
  bool any = false;
  for (int w = 0; w < num_workers(); ++w) {
    if (!live_[w]) continue;
    any = true;
    if (pushed_[w] <= rounds_applied_) return false;
  }
  if (any) return true;
  // Nobody live: the round a worker that left pushed into is complete (its push is the round's).
  for (int w = 0; w < num_workers(); ++w)
    if (left_[w] && pushed_[w] > rounds_applied_) return true;
  return false;
}

void ConsistencyController::RemoveWorker(int worker) {
  if (worker < 0 || worker >= num_workers()) return;
  live_[worker] = false;
  left_[worker] = false;
}

void ConsistencyController::EndAt(int worker, int64_t clock) {
  if (worker < 0 || worker >= num_workers() || clock < 0) return;
  ended_[worker] = clock;
}

void ConsistencyController::Leave(int worker) {
  if (worker < 0 || worker >= num_workers()) return;
  live_[worker] = false;
  left_[worker] = true;
}

std::optional<int> ConsistencyController::Blocker(int /*worker*/, int64_t clock) const {
  if (mode_ == ConsistencyMode::kAsp) return std::nullopt;
  if (aggregate_ && rounds_applied_ >= clock) return std::nullopt;
  // The pushes the pull needs of every live worker: round clock-1's (aggregating), or clock - s.
  const int64_t needed = aggregate_ ? clock : clock - staleness_;
  std::optional<int> blocker;
  for (int w = 0; w < num_workers(); ++w) {
    if (!live_[w] || ended_[w] < 0 || ended_[w] >= needed) continue;
    if (!blocker || ended_[w] < ended_[*blocker]) blocker = w;
  }
  return blocker;
}

Status ConsistencyController::BlockedError(int64_t clock, int blocker) const {
  const int64_t ended = ended_at(blocker);
  const int64_t needed = aggregate_ ? clock : clock - staleness_;
  return FailedPreconditionError(
      "worker " + std::to_string(blocker) + " ended training after " + std::to_string(ended) +
      " steps, but this worker's step " + std::to_string(clock) + " needs its push of step " +
      std::to_string(needed - 1) + " (" + ConsistencyRuleName(mode_, staleness_) + "): " + UnevenStepsAdvice());
}

void ConsistencyController::SetWorker(int worker, int64_t clock) {
  if (worker < 0 || worker >= num_workers()) return;
  if (!live_[worker]) {
    left_[worker] = false;
    ended_[worker] = -1;
  }
  live_[worker] = true;
  pushed_[worker] = clock;
}

int64_t ConsistencyController::Suggest(int worker) const {
  if (aggregate_) return rounds_applied_;
  int64_t m = std::numeric_limits<int64_t>::max();
  for (int w = 0; w < num_workers(); ++w)
    if (live_[w] && w != worker) m = std::min(m, pushed_[w]);
  if (m != std::numeric_limits<int64_t>::max()) return m;
  return worker >= 0 && worker < num_workers() ? pushed_[worker] : 0;
}

Status ConsistencyController::Restore(std::vector<int64_t> pushed, std::vector<bool> live, int64_t rounds_applied) {
  if (pushed.size() != pushed_.size() || live.size() != live_.size()) {
    return DataLossError("checkpoint is for " + std::to_string(pushed.size()) + " workers, the job has " +
                         std::to_string(pushed_.size()));
  }
  for (int64_t p : pushed)
    if (p < 0) return DataLossError("checkpoint has a negative clock");
  if (rounds_applied < 0) return DataLossError("checkpoint has a negative round");
  pushed_ = std::move(pushed);
  live_ = std::move(live);
  rounds_applied_ = rounds_applied;
  return OkStatus();
}

int ConsistencyController::live_workers() const {
  return static_cast<int>(std::count(live_.begin(), live_.end(), true));
}

int64_t ConsistencyController::min_live_clock() const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (int w = 0; w < num_workers(); ++w)
    if (live_[w]) m = std::min(m, pushed_[w]);
  return m == std::numeric_limits<int64_t>::max() ? 0 : m;
}

}  // namespace gradsync
