#include "common/base/numeric/parallel_for.h"

#include <algorithm>

namespace gradsync {

ParallelFor::ParallelFor(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { Loop(static_cast<size_t>(i)); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ParallelFor::Run(size_t n, size_t min_piece, const std::function<void(size_t, size_t)>& fn) {
  const size_t pieces = std::min<size_t>(threads(), n / std::max<size_t>(1, min_piece));
  if (pieces <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  {
    std::lock_guard lock(mu_);
    fn_ = &fn;
    n_ = n;
    pieces_ = pieces;
    pending_ = pieces - 1;
    ++generation_;
  }
  start_.notify_all();
  fn(0, n / pieces);
  std::unique_lock lock(mu_);
  done_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ParallelFor::Loop(size_t index) {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  while (true) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= pieces_) continue;
    const size_t begin = n_ * index / pieces_, end = n_ * (index + 1) / pieces_;
    const auto* fn = fn_;
    lock.unlock();
    (*fn)(begin, end);
    lock.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace gradsync
