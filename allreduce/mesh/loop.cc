#include "allreduce/mesh/loop.h"

namespace gradsync {
namespace asio = boost::asio;

size_t MeshLoop::RunOne(Clock::time_point deadline) {
  if (cancelled_.load(std::memory_order_acquire)) return 0;  // the caller fails; Fail says why
  // Poll first: a peer's answer usually comes within microseconds, and a thread that sleeps in
  // epoll pays a wake-up for every step. Yielding between polls leaves the core to a rank that
  // shares it.
  if (wait_.polls()) {
    Waiter waiter(wait_);
    do {
      if (const size_t ran = io_.poll_one(); ran > 0) return ran;
      if (io_.stopped()) io_.restart();
    } while (waiter.Poll());
  }
  return io_.run_one_until(deadline);
}

MeshLoop::Clock::time_point MeshLoop::Deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
}

bool MeshLoop::Cancel(const std::string& why) {
  {
    std::lock_guard lock(cancel_mu_);
    if (cancelled_.load()) return false;
    cancel_why_ = why;
  }
  cancelled_.store(true);
  asio::post(io_, [] {});  // wakes a RunOne that waits, which then sees cancelled_
  return true;
}

std::string MeshLoop::cancel_reason() {
  std::lock_guard lock(cancel_mu_);
  return cancel_why_;
}

void MeshLoop::RetryAfter(std::chrono::microseconds delay, std::function<void()> fn) {
  if (stopped_) return;
  std::erase_if(retries_, [](const auto& weak) { return weak.expired(); });
  auto timer = std::make_shared<asio::steady_timer>(io_, delay);
  retries_.push_back(timer);
  timer->async_wait([timer, fn = std::move(fn)](const boost::system::error_code& e) {
    if (!e) fn();  // cancelled (aborted): the operation that asked is gone
  });
}

void MeshLoop::Stop() {
  stopped_ = true;
  for (auto& weak : retries_) {
    if (auto timer = weak.lock()) timer->cancel();
  }
  retries_.clear();
}

void MeshLoop::Drain() {
  io_.restart();
  io_.poll();
}

}  // namespace gradsync
