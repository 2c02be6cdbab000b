#include "server/scheduler/node_roster.h"

#include "common/net/control/node.h"

namespace gradsync {

NodeRecord* NodeRoster::Find(const std::string& identity) {
  auto it = by_identity_.find(identity);
  return it == by_identity_.end() ? nullptr : &nodes_[it->second];
}

void NodeRoster::Add(NodeRecord n) {
  by_identity_[n.identity] = nodes_.size();
  nodes_.push_back(std::move(n));
}

void NodeRoster::Rebind(NodeRecord& slot, const std::string& identity) {
  by_identity_.erase(slot.identity);
  replaced_[slot.identity] = NodeName(slot.info);
  slot.identity = identity;
  by_identity_[identity] = SlotOf(slot);
}

const std::string* NodeRoster::Replaced(const std::string& identity) const {
  auto r = replaced_.find(identity);
  return r == replaced_.end() ? nullptr : &r->second;
}

std::vector<NodeRecord*> NodeRoster::Members(const std::string& group) {
  // While some worker still trains, a worker that joined (left the consistency rule) takes no
  // part in the workers' barriers and gathers: those the others train through go on without it.
  // It may still arrive at one (its end of training), and is released with the members. Once
  // no worker trains, every worker is a member again.
  bool training = false;
  for (const auto& n : nodes_) {
    training = training || (n.info.role() == wire::WORKER && !n.dead && !n.finished && n.ended_clock < 0);
  }
  std::vector<NodeRecord*> out;
  for (auto& n : nodes_) {
    if (n.dead || n.finished) continue;
    if (training && group != "servers" && n.info.role() == wire::WORKER && n.ended_joined) continue;
    if (group == "workers" && n.info.role() != wire::WORKER) continue;
    if (group == "servers" && n.info.role() != wire::SERVER) continue;
    out.push_back(&n);
  }
  return out;
}

NodeRecord* NodeRoster::DeadSlotFor(const wire::NodeInfo& info) {
  for (auto& n : nodes_) {
    if (n.info.role() != info.role() || !n.dead || n.finished) continue;
    if (info.requested_rank() >= 0 && n.info.rank() != info.requested_rank()) continue;
    return &n;
  }
  return nullptr;
}

NodeRecord* NodeRoster::LiveNode(wire::Role role, int rank) {
  for (auto& n : nodes_) {
    if (n.info.role() == role && n.info.rank() == rank && !n.dead && !n.finished) return &n;
  }
  return nullptr;
}

std::vector<ServerSlot> NodeRoster::ServerSlots() const {
  std::vector<ServerSlot> out;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const NodeRecord& n = nodes_[i];
    if (n.info.role() == wire::SERVER) out.push_back({i, n.info.rank(), n.info.standby(), n.dead, NodeName(n.info)});
  }
  return out;
}

bool NodeRoster::WorkersDone() const {
  for (const auto& n : nodes_)
    if (n.info.role() == wire::WORKER && !n.dead && !n.finished) return false;
  return true;
}

}  // namespace gradsync
