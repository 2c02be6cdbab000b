// WaitPolicy: how a thread waits for what another thread, process or peer will do, one rule for
// every wait of the product: pause the core a few times (a partner on another core answers within
// nanoseconds), then poll, yielding the core between checks, for up to busy_poll_ms (a thread
// that stays runnable takes an answer as soon as it is in, instead of paying a wake-up), then
// block the caller's own way (a futex, a socket poll, epoll) in slices. --busy-poll-ms sets
// busy_poll_ms (WaitPolicyOf, common/config/train_config.h); each waiter adds its own pauses and
// minimum polls.
//
//   Waiter w(policy, &busy_polls_);
//   while (!ready()) {
//     if (w.Poll()) continue;   // paused or yielded: check again
//     BlockUpTo(20ms);          // past the polling: block, then check again
//   }
#pragma once

#include <chrono>
#include <cstdint>

namespace gradsync {

struct WaitPolicy {
  double busy_poll_ms = 0;  // poll (yielding between checks) this long before blocking
  int pause_spins = 0;      // CPU pauses before the first yield
  int min_polls = 0;        // yields made before blocking even when busy_poll_ms is 0
  // Whether a wait checks again before it blocks at all (a Waiter's first Poll may return true).
  bool polls() const { return busy_poll_ms > 0 || pause_spins > 0 || min_polls > 0; }
};

// One wait under a policy. Not thread-safe: one per waiting thread and wait.
class Waiter {
 public:
  // `busy_polls`, if set, counts the yields busy_poll_ms asked for (past min_polls) when the
  // waiter is destroyed.
  explicit Waiter(const WaitPolicy& policy, int64_t* busy_polls = nullptr);
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  // After a check that found nothing: pauses or yields and returns true while the policy says to
  // check again without blocking; false once it says to block (every later call too, until the
  // caller's block has ended: then it returns false again at once, and the caller blocks again).
  bool Poll();
  // Whether the last Poll only paused (a caller may skip its own clock reads while it does).
  bool pausing() const { return polls_ <= policy_.pause_spins; }

 private:
  using Clock = std::chrono::steady_clock;
  WaitPolicy policy_;
  int64_t* busy_polls_;
  int64_t polls_ = 0;       // Poll calls so far
  int64_t counted_ = 0;     // of them, yields busy_poll_ms asked for
  Clock::time_point poll_until_{};  // set at the first yield
};

// Gives the core to another runnable thread once: for a wait with nothing to block on (ZeroMQ
// letting go of lent buffers).
void YieldCore();

}  // namespace gradsync
