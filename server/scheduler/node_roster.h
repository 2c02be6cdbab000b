// NodeRoster: the nodes of a job as the scheduler knows them, one record per slot (a restarted
// node takes a dead one's slot again; a standby gets a new one), found by the identity of their
// connection; the identities of nodes whose rank another took (told so if they speak again); and
// the questions asked of them: the live members of a barrier's group, a dead slot for a restarted
// node, the live node of a rank, the servers as ShardCopies sees them, whether every worker is done.
//
// Threading: the scheduler's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "gradsync.pb.h"
#include "server/scheduler/shard_copies.h"

namespace gradsync {

// A node of the job, as the scheduler follows it.
struct NodeRecord {
  wire::NodeInfo info;
  std::string identity;
  double last_seen = 0;
  bool dead = false;
  double dead_at = 0;  // when it was declared dead
  bool finished = false;
  Status result;
  int rejoins = 0;
  int64_t listening = 0;                 // servers: the message size their data socket accepts
  bool announce_when_listening = false;  // a restarted server: NODE_JOINED once it accepts the job's
  // A worker that ended training (TRAINING_ENDED): its clock (-1: it has not), and whether it
  // left the consistency rule (join).
  int64_t ended_clock = -1;
  bool ended_joined = false;
};

class NodeRoster {
 public:
  std::vector<NodeRecord>& nodes() { return nodes_; }
  const std::vector<NodeRecord>& nodes() const { return nodes_; }
  // The node that speaks on connection `identity`; null when none does.
  NodeRecord* Find(const std::string& identity);
  // A new slot for `n` (its identity set).
  void Add(NodeRecord n);
  // A restarted node takes `slot` on connection `identity`: the predecessor's identity, should it
  // speak again, is told it was replaced (Replaced).
  void Rebind(NodeRecord& slot, const std::string& identity);
  // The name of the node that spoke on `identity` before another took its rank; null if none.
  const std::string* Replaced(const std::string& identity) const;
  size_t SlotOf(const NodeRecord& n) const { return static_cast<size_t>(&n - nodes_.data()); }

  // The live members of a barrier's `group` ("workers", "servers" or "all").
  std::vector<NodeRecord*> Members(const std::string& group);
  // A restarted node's slot: a dead node of its role (the rank it asks for, else the first).
  NodeRecord* DeadSlotFor(const wire::NodeInfo& info);
  // The live (not finished) node of `role` and `rank`, if any.
  NodeRecord* LiveNode(wire::Role role, int rank);
  // The server nodes as ShardCopies sees them, in slot order.
  std::vector<ServerSlot> ServerSlots() const;
  // Every worker has finished or died.
  bool WorkersDone() const;

 private:
  std::vector<NodeRecord> nodes_;
  std::map<std::string, size_t> by_identity_;
  std::map<std::string, std::string> replaced_;  // identity of a node whose rank another took -> its name
};

}  // namespace gradsync
