#include "experiments/sim/engine/cpus.h"

#include <algorithm>
#include <utility>

namespace gradsync::sim {

Cpus::Cpus(Engine& engine, int hosts, int shared_cores, double usable_cores)
    : engine_(engine),
      cores_(std::max(0, shared_cores)),
      usable_(usable_cores > 0 ? usable_cores : cores_),
      host_free_(static_cast<size_t>(hosts), 0),
      busy_us_(static_cast<size_t>(hosts), 0),
      queued_(static_cast<size_t>(hosts)),
      host_running_(static_cast<size_t>(hosts), false) {}

void Cpus::Run(int h, double us, std::function<void()> done) {
  if (us <= 0) {  // nothing to run: not behind the host's earlier work either
    engine_.At(engine_.now(), std::move(done));
    return;
  }
  busy_us_[static_cast<size_t>(h)] += us;
  if (cores_ == 0) {
    const Time start = std::max(engine_.now(), host_free_[static_cast<size_t>(h)]);
    host_free_[static_cast<size_t>(h)] = start + us;
    engine_.At(start + us, std::move(done));
    return;
  }
  Task t{us, h, std::move(done)};
  if (host_running_[static_cast<size_t>(h)]) {
    queued_[static_cast<size_t>(h)].push_back(std::move(t));
    return;
  }
  host_running_[static_cast<size_t>(h)] = true;
  Add(std::move(t));
}

void Cpus::Kernel(double us, std::function<void()> done) {
  if (cores_ == 0 || us <= 0) {
    done();
    return;
  }
  kernel_us_ += us;
  Add(Task{us, -1, std::move(done)});
}

double Cpus::Rate() const {
  return running_.empty() ? 1.0 : std::min(1.0, usable_ / static_cast<double>(running_.size()));
}

void Cpus::Advance() {
  const double ran = (engine_.now() - updated_) * Rate();
  if (ran > 0)
    for (Task& t : running_) t.left -= ran;
  updated_ = engine_.now();
}

void Cpus::Add(Task t) {
  Advance();
  running_.push_back(std::move(t));
  Schedule();
}

void Cpus::Schedule() {
  if (running_.empty()) return;
  double first = running_.front().left;
  for (const Task& t : running_) first = std::min(first, t.left);
  const uint64_t gen = ++gen_;
  engine_.At(engine_.now() + std::max(0.0, first) / Rate(), [this, gen] {
    if (gen == gen_) Tick();
  });
}

void Cpus::Tick() {
  Advance();
  std::vector<std::function<void()>> ended;
  const double rate = Rate();
  for (size_t i = 0; i < running_.size();) {
    // Done: nothing left, or too little to move the clock (late in a long run, a microsecond's
    // fraction no longer does).
    if (running_[i].left > 1e-6 && engine_.now() + running_[i].left / rate > engine_.now()) {
      ++i;
      continue;
    }
    ended.push_back(std::move(running_[i].done));
    const int h = running_[i].host;
    running_[i] = std::move(running_.back());
    running_.pop_back();
    if (h < 0) continue;
    auto& q = queued_[static_cast<size_t>(h)];
    if (q.empty()) {
      host_running_[static_cast<size_t>(h)] = false;
    } else {
      running_.push_back(std::move(q.front()));
      q.pop_front();
    }
  }
  Schedule();
  for (auto& f : ended) f();
}

}  // namespace gradsync::sim
