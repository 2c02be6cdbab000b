// MeshLoop: the mesh's one I/O loop, driven by the calling thread (no background threads). It
// runs handlers, polling first as the mesh's wait policy says (common/base/wait_policy.h) and
// then sleeping in epoll until a deadline; it knows the deadline of an operation that makes no
// progress; it takes a cancellation from any thread; and it runs retries after a delay, which
// Stop cancels, so that no handler outlives the operation whose locals it refers to.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/wait_policy.h"

namespace gradsync {

class MeshLoop {
 public:
  using Clock = std::chrono::steady_clock;

  MeshLoop(const WaitPolicy& wait, double timeout_s) : wait_(wait), timeout_s_(timeout_s) {}

  boost::asio::io_context& io() { return io_; }
  // Runs one handler: polls for up to the wait policy's busy_poll_ms, then blocks until
  // `deadline`. Returns how many ran (0: the deadline passed, or the mesh was cancelled).
  size_t RunOne(Clock::time_point deadline);
  // Before a loop of RunOne.
  void Restart() { io_.restart(); }
  // Now plus the timeout: the deadline of an operation that makes no progress.
  Clock::time_point Deadline() const;
  double timeout_s() const { return timeout_s_; }

  // From any thread: every RunOne from now on returns 0. Returns false if it was cancelled
  // already.
  bool Cancel(const std::string& why);
  bool cancelled() const { return cancelled_.load(); }
  std::string cancel_reason();

  // Runs `fn` on the loop after `delay`, unless Stop comes first.
  void RetryAfter(std::chrono::microseconds delay, std::function<void()> fn);
  // No more retries: the pending ones are cancelled, later ones never start.
  void Stop();
  // Lets handlers still queued run (and see operation_aborted) while their captures are alive.
  void Drain();

 private:
  boost::asio::io_context io_;
  const WaitPolicy wait_;
  const double timeout_s_;
  bool stopped_ = false;
  std::atomic<bool> cancelled_{false};  // Cancel: set from any thread
  std::mutex cancel_mu_;
  std::string cancel_why_;  // under cancel_mu_
  std::vector<std::weak_ptr<boost::asio::steady_timer>> retries_;
};

}  // namespace gradsync
