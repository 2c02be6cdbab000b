#include "common/net/control/client/barrier_waits.h"

#include <algorithm>
#include <chrono>

#include "common/base/clock.h"

namespace gradsync {

void BarrierWaits::Released(const ControlMessage& c) {
  {
    std::lock_guard lock(mu_);
    if (!c.status.ok()) {
      // Given up: a member will never come (the scheduler says why).
      failed_[c.barrier.name] = Status(c.status.code(), "scheduler: " + c.status.message());
    } else {
      released_.insert(c.barrier.name);
      if (!c.barrier.gathered.empty()) gathered_[c.barrier.name] = c.barrier.gathered;
    }
  }
  cv_.notify_all();
}

void BarrierWaits::LimitAnswer(const ControlMessage& c) {
  {
    std::lock_guard lock(mu_);
    if (!c.status.ok()) limit_error_ = c.status;
    else limit_accepted_ = std::max<int64_t>(limit_accepted_, static_cast<int64_t>(c.max_message_bytes));
  }
  cv_.notify_all();
}

Result<std::vector<std::string>> BarrierWaits::Wait(const std::string& name, double timeout_s) {
  std::unique_lock lock(mu_);
  bool done = cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    return released_.count(name) > 0 || failed_.count(name) > 0 || !standing_.running();
  });
  if (Status h = standing_.health(); !h.ok()) return h;
  if (auto failed = failed_.find(name); failed != failed_.end()) {
    Status why = failed->second;
    failed_.erase(failed);
    return why;
  }
  if (released_.count(name)) {
    std::vector<std::string> out;
    if (auto it = gathered_.find(name); it != gathered_.end()) {
      out = std::move(it->second);
      gathered_.erase(it);
    }
    return out;
  }
  if (standing_.shutdown_requested()) return AbortedError("the job shut down during barrier '" + name + "'");
  (void)done;
  return DeadlineExceededError("barrier '" + name + "' not released within " + SecondsText(timeout_s) + " s");
}

Status BarrierWaits::WaitLimit(int64_t bytes, double timeout_s) {
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    return limit_accepted_ >= bytes || !limit_error_.ok() || !standing_.running();
  });
  if (Status h = standing_.health(); !h.ok()) return h;
  if (!limit_error_.ok()) return limit_error_;
  if (limit_accepted_ >= bytes) return OkStatus();
  if (standing_.shutdown_requested()) {
    return AbortedError("the job shut down before the shards accepted this worker's messages");
  }
  (void)done;
  return DeadlineExceededError("the shards did not accept messages of " + std::to_string(bytes) + " bytes within " +
                               SecondsText(timeout_s) + " s");
}

void BarrierWaits::Wake() {
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

}  // namespace gradsync
