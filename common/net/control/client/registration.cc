#include "common/net/control/client/registration.h"

namespace gradsync {

void Registration::Accept(const ControlMessage& reply) {
  {
    std::lock_guard lock(mu_);
    rank_ = reply.node.rank();
    rejoined_ = reply.job.rejoined;
    replica_key_ = reply.job.replica_key;
    registered_ = true;
  }
  cv_.notify_all();
}

bool Registration::TakeRefusal(const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (registered_) return false;
    refusal_ = why;
  }
  cv_.notify_all();
  return true;
}

std::optional<Status> Registration::Wait(Deadline deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return registered_ || !refusal_.ok() || !standing_.ok(); });
  if (!refusal_.ok()) {
    // kUnavailable: the scheduler wants this node to ask again (a restarted node whose
    // predecessor is not declared dead yet).
    Status refused = refusal_;
    if (refused.code() == StatusCode::kUnavailable) refusal_ = OkStatus();
    return refused;
  }
  if (registered_) return OkStatus();
  return std::nullopt;
}

void Registration::Wake() {
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

int Registration::rank() const {
  std::lock_guard lock(mu_);
  return rank_;
}

bool Registration::rejoined() const {
  std::lock_guard lock(mu_);
  return rejoined_;
}

std::string Registration::replica_key() const {
  std::lock_guard lock(mu_);
  return replica_key_;
}

}  // namespace gradsync
