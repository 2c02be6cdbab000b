#include "common/base/wait_policy.h"

#include <thread>

namespace gradsync {
namespace {

inline void CpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

Waiter::Waiter(const WaitPolicy& policy, int64_t* busy_polls) : policy_(policy), busy_polls_(busy_polls) {}

Waiter::~Waiter() {
  if (busy_polls_ != nullptr) *busy_polls_ += counted_;
}

bool Waiter::Poll() {
  const int64_t n = polls_++;
  if (n < policy_.pause_spins) {
    CpuPause();
    return true;
  }
  const auto now = Clock::now();
  if (poll_until_ == Clock::time_point{}) {
    poll_until_ = now + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double, std::milli>(policy_.busy_poll_ms > 0 ? policy_.busy_poll_ms : 0));
  }
  const bool minimum = n < static_cast<int64_t>(policy_.pause_spins) + policy_.min_polls;
  if (!minimum && now >= poll_until_) return false;
  if (!minimum) ++counted_;
  std::this_thread::yield();
  return true;
}

void YieldCore() { std::this_thread::yield(); }

}  // namespace gradsync
