#include "server/membership.h"

#include <algorithm>

namespace gradsync {

Status Membership::CheckSender(const PsRequest& r, const std::string& peer, int num_workers,
                               const ConsistencyController& rule) {
  const int w = r.worker;
  if (w < 0 || w >= num_workers) {
    return InvalidArgumentError("unregistered sender: worker " + std::to_string(w) + " is not in the job");
  }
  if (r.type == wire::JOIN && !rule.clocks().IsLive(w)) {
    // A restarted worker: only once the scheduler has announced it (then its new connection
    // takes the rank over); before that it may simply be early, so it retries.
    if (!may_join_.count(w)) {
      return UnavailableError("worker " + std::to_string(w) + " has not been announced as rejoined yet; retry");
    }
    identity_of_worker_[w] = peer;
    return OkStatus();
  }
  auto it = identity_of_worker_.find(w);
  if (it == identity_of_worker_.end()) {
    identity_of_worker_[w] = peer;  // first contact binds the connection to the rank
  } else if (it->second != peer) {
    return InvalidArgumentError("unregistered sender: another connection already speaks for worker " +
                                std::to_string(w));
  }
  // A worker that left the consistency rule (join) still pulls; the controller refuses its pushes.
  if (!rule.clocks().IsLive(w) && !rule.clocks().HasLeft(w)) {
    return FailedPreconditionError("worker " + std::to_string(w) + " was declared dead");
  }
  return OkStatus();
}

void Membership::Announced(int worker) {
  identity_of_worker_.erase(worker);
  may_join_.insert(worker);
}

void Membership::ForgetConnections() {
  identity_of_worker_.clear();
  may_join_.clear();
}

void Membership::ResetNews() {
  seen_events_ = 0;
  seen_dead_ = seen_joined_ = seen_ended_ = 0;
}

void Membership::Restored(std::vector<int64_t> pushed) {
  restored_pushed_ = std::move(pushed);
  resynced_.clear();
  restored_ = true;
}

std::optional<int64_t> Membership::Resync(int worker, int64_t clock, int64_t at) {
  if (!restored_ || resynced_.count(worker)) return std::nullopt;
  resynced_.insert(worker);
  // The pushes it had made past what was restored, less any it sent again since.
  return clock - at;
}

int64_t Membership::restored_clock(int worker) const {
  return worker >= 0 && static_cast<size_t>(worker) < restored_pushed_.size() ? restored_pushed_[worker] : 0;
}

namespace {
// The entries of `all` (a list the scheduler only appends to) past the first *seen; *seen moves on.
template <typename T>
std::vector<T> Unseen(std::vector<T> all, size_t* seen) {
  all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(*seen, all.size())));
  *seen += all.size();
  return all;
}
}  // namespace

std::vector<wire::NodeInfo> Membership::NewDead(const SchedulerClient& scheduler) {
  return Unseen(scheduler.news().dead_nodes(), &seen_dead_);
}

std::vector<wire::NodeInfo> Membership::NewJoined(const SchedulerClient& scheduler) {
  return Unseen(scheduler.news().joined_nodes(), &seen_joined_);
}

std::vector<EndedWorker> Membership::NewEnded(const SchedulerClient& scheduler) {
  return Unseen(scheduler.news().ended_workers(), &seen_ended_);
}

bool Membership::News(const SchedulerClient& scheduler) {
  if (scheduler.events() == seen_events_) return false;
  seen_events_ = scheduler.events();
  return true;
}

}  // namespace gradsync
