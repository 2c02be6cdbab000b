#include "common/ps/worker_clocks.h"

#include <algorithm>
#include <limits>
#include <string>

namespace gradsync {

WorkerClocks::WorkerClocks(int num_workers)
    : pushed_(static_cast<size_t>(num_workers), 0),
      live_(static_cast<size_t>(num_workers), true),
      left_(static_cast<size_t>(num_workers), false),
      ended_(static_cast<size_t>(num_workers), -1) {}

void WorkerClocks::RemoveWorker(int worker) {
  if (worker < 0 || worker >= num_workers()) return;
  live_[worker] = false;
  left_[worker] = false;
}

void WorkerClocks::EndAt(int worker, int64_t clock) {
  if (worker < 0 || worker >= num_workers() || clock < 0) return;
  ended_[worker] = clock;
}

void WorkerClocks::Leave(int worker) {
  if (worker < 0 || worker >= num_workers()) return;
  live_[worker] = false;
  left_[worker] = true;
}

void WorkerClocks::SetWorker(int worker, int64_t clock) {
  if (worker < 0 || worker >= num_workers()) return;
  if (!live_[worker]) {
    left_[worker] = false;
    ended_[worker] = -1;
  }
  live_[worker] = true;
  pushed_[worker] = clock;
}

Status WorkerClocks::Restore(std::vector<int64_t> pushed, std::vector<bool> live, int64_t rounds_applied) {
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

int WorkerClocks::live_workers() const {
  return static_cast<int>(std::count(live_.begin(), live_.end(), true));
}

int64_t WorkerClocks::min_live_clock() const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (int w = 0; w < num_workers(); ++w)
    if (live_[w]) m = std::min(m, pushed_[w]);
  return m == std::numeric_limits<int64_t>::max() ? 0 : m;
}

}  // namespace gradsync
