#include "common/net/control/client/job_news.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/net/control/node.h"

namespace gradsync {

void JobNews::Registered(const wire::ClusterTable& table) {
  std::lock_guard lock(mu_);
  table_ = table;
}

void JobNews::Dead(const wire::NodeInfo& n) {
  {
    std::lock_guard lock(mu_);
    dead_.push_back(n);
    dead_now_.insert({n.role(), n.rank()});
    standing_.Bump();
  }
  std::lock_guard lock(on_dead_mu_);
  if (on_dead_) on_dead_(n);
}

void JobNews::Joined(const wire::NodeInfo& n) {
  std::lock_guard lock(mu_);
  auto* slots = n.role() == wire::SERVER ? table_.mutable_servers() : table_.mutable_workers();
  if (n.standby()) {
    *table_.add_standbys() = n;  // a standby holds no rank of the table's servers
  } else if (n.rank() >= 0 && n.rank() < slots->size()) {
    *slots->Mutable(n.rank()) = n;
  }
  joined_.push_back(n);
  dead_now_.erase({n.role(), n.rank()});
  standing_.Bump();
}

void JobNews::Ended(const ControlMessage& c) {
  if (c.node.role() != wire::WORKER || c.node.rank() < 0 || c.ended.clock < 0) {
    GRADSYNC_LOG(WARNING) << "scheduler: dropped a TRAINING_ENDED for " << NodeName(c.node) << " at clock "
                          << c.ended.clock;
    return;
  }
  std::lock_guard lock(mu_);
  ended_.push_back({c.node.rank(), c.ended.clock, c.ended.joined});
  standing_.Bump();
}

void JobNews::ShardLimit(uint64_t bytes) {
  std::lock_guard lock(mu_);
  table_.set_max_message_bytes(std::max(table_.max_message_bytes(), bytes));
  standing_.Bump();
}

std::vector<wire::NodeInfo> JobNews::dead_nodes() const {
  std::lock_guard lock(mu_);
  return dead_;
}

std::vector<wire::NodeInfo> JobNews::joined_nodes() const {
  std::lock_guard lock(mu_);
  return joined_;
}

std::vector<EndedWorker> JobNews::ended_workers() const {
  std::lock_guard lock(mu_);
  return ended_;
}

bool JobNews::IsDead(wire::Role role, int rank) const {
  std::lock_guard lock(mu_);
  return dead_now_.count({role, rank}) > 0;
}

wire::ClusterTable JobNews::table() const {
  std::lock_guard lock(mu_);
  return table_;
}

void JobNews::set_on_dead(std::function<void(const wire::NodeInfo&)> fn) {
  std::lock_guard lock(on_dead_mu_);
  on_dead_ = std::move(fn);
}

}  // namespace gradsync
