#include "common/net/control/client/clock_estimate.h"

#include <chrono>
#include <cmath>

#include "common/base/clock.h"

namespace gradsync {

void ClockEstimate::Answered(const ControlMessage& h) {
  {
    std::lock_guard lock(mu_);
    if (h.probe.sent_us > 0 && std::isfinite(h.probe.sent_us) && h.probe.scheduler_us > 0 &&
        std::isfinite(h.probe.scheduler_us)) {
      // The scheduler read its clock between this node's send and now: the round trip's
      // midpoint, with the least error where the round trip was shortest.
      const double now = SteadyMicros();
      const double rtt = now - h.probe.sent_us;
      if (rtt >= 0 && (rtt_us_ < 0 || rtt < rtt_us_)) {
        rtt_us_ = rtt;
        offset_us_ = h.probe.scheduler_us - (h.probe.sent_us + now) / 2;
      }
      answered_++;
    }
  }
  cv_.notify_all();
}

void ClockEstimate::Estimate(int probes, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int i = 0; i < probes; ++i) {
    int answered = 0;
    {
      std::lock_guard lock(mu_);
      answered = answered_;
    }
    link_.Send(Control(wire::HEARTBEAT));
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return answered_ > answered || !standing_.ok(); }) || !standing_.ok()) {
      return;
    }
  }
}

double ClockEstimate::offset_us() const {
  std::lock_guard lock(mu_);
  return offset_us_;
}

double ClockEstimate::rtt_us() const {
  std::lock_guard lock(mu_);
  return rtt_us_;
}

void ClockEstimate::Wake() {
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

}  // namespace gradsync
