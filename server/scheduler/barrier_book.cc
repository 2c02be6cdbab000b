#include "server/scheduler/barrier_book.h"

#include "common/base/logging.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/control/node.h"
#include "common/obs/trace.h"
#include "common/ps/consistency.h"

namespace gradsync {

void BarrierBook::Arrive(const std::string& peer, const ControlMessage& c) {
  if (c.barrier.data.size() > kMaxGatherBytes) {
    return replies_.Error(peer, InvalidArgumentError("barrier '" + c.barrier.name + "': " +
                                                     std::to_string(c.barrier.data.size()) +
                                                     " bytes of gather data, at most " + std::to_string(kMaxGatherBytes)));
  }
  if (!c.barrier.data.empty()) {
    // The release carries every member's data: it must fit what nodes accept from here.
    auto& data = data_[c.barrier.name];
    size_t total = c.barrier.data.size();
    for (const auto& [id, d] : data) total += id == peer ? 0 : d.size();
    if (total + (64 << 10) > static_cast<size_t>(kMaxSchedulerReplyBytes)) {
      if (data.empty()) data_.erase(c.barrier.name);
      return replies_.Error(peer, InvalidArgumentError("barrier '" + c.barrier.name + "': " + std::to_string(total) +
                                                       " bytes of gather data in all, at most " +
                                                       std::to_string(kMaxSchedulerReplyBytes - (64 << 10))));
    }
    data[peer] = c.barrier.data;
  }
  arrivals_[c.barrier.name].insert(peer);
  group_[c.barrier.name] = c.barrier.group;
  Check();
}

const NodeRecord* BarrierBook::EndedAbsent(const std::vector<NodeRecord*>& members, const std::string& barrier) const {
  if (barrier == kTrainedBarrier) return nullptr;  // the one barrier a worker that ended still comes to
  const auto& arrived = arrivals_.at(barrier);
  // Only a worker that still trains can be at a barrier of training; one that ended without
  // joining is past all of them (at its end, or gone), so it never comes to this one.
  bool trainer_waits = false;
  for (const NodeRecord* n : members) {
    trainer_waits = trainer_waits || (arrived.count(n->identity) && n->info.role() == wire::WORKER && n->ended_clock < 0);
  }
  if (!trainer_waits) return nullptr;
  for (const NodeRecord* n : members) {
    if (n->info.role() == wire::WORKER && n->ended_clock >= 0 && !n->ended_joined && !arrived.count(n->identity)) return n;
  }
  return nullptr;
}

void BarrierBook::Check() {
  for (auto it = arrivals_.begin(); it != arrivals_.end();) {
    const auto members = roster_.Members(group_[it->first]);
    // No member left (every worker joined): those that arrived are all there is.
    bool all = !members.empty() || !it->second.empty();
    for (const NodeRecord* n : members) all = all && it->second.count(n->identity);
    if (!all) {
      if (const NodeRecord* gone = EndedAbsent(members, it->first); gone != nullptr) {
        // A worker that ended training (without join) will never come to a barrier that workers
        // still training wait at. Those waiting here fail now, told why.
        const Status why = FailedPreconditionError(
            "barrier '" + it->first + "' waits for " + NodeName(gone->info) + ", which ended training after " +
            std::to_string(gone->ended_clock) + " steps while this worker still trains: " + UnevenStepsAdvice());
        GRADSYNC_LOG(WARNING) << "scheduler: " << why.message();
        ControlMessage failed = Control(wire::BARRIER_RELEASE);
        failed.barrier.name = it->first;
        failed.status = why;
        for (const auto& id : it->second) replies_.Reply(id, failed);
        data_.erase(it->first);
        group_.erase(it->first);
        it = arrivals_.erase(it);
        continue;
      }
      ++it;
      continue;
    }
    ControlMessage h = Control(wire::BARRIER_RELEASE);
    h.barrier.name = it->first;
    // A gather: entry r is the data of the member of rank r (empty: none, or no such member).
    if (auto d = data_.find(it->first); d != data_.end()) {
      for (const NodeRecord* n : members) {
        auto mine = d->second.find(n->identity);
        if (mine == d->second.end() || n->info.rank() < 0) continue;
        if (h.barrier.gathered.size() <= static_cast<size_t>(n->info.rank())) {
          h.barrier.gathered.resize(static_cast<size_t>(n->info.rank()) + 1);
        }
        h.barrier.gathered[static_cast<size_t>(n->info.rank())] = mine->second;
      }
      data_.erase(d);
    }
    for (const auto& id : it->second) replies_.Reply(id, h);
    TraceInstant("barrier released", "job", {{"members", static_cast<double>(members.size())}});
    group_.erase(it->first);
    it = arrivals_.erase(it);
  }
}

}  // namespace gradsync
