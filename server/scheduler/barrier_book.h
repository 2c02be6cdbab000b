// BarrierBook: the job's open barriers as the scheduler holds them: who arrived at each (by
// connection), its group, and a gather's data (each member's, checked against what nodes accept
// from the scheduler); released when every live member of the group has arrived (a gather's
// release carries each member's data by rank), or given up, told why, when a member that ended
// training will never come while a worker that still trains waits there.
//
// Threading: the scheduler's.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/net/control/control_protocol.h"
#include "server/scheduler/control_replies.h"
#include "server/scheduler/node_roster.h"

namespace gradsync {

class BarrierBook {
 public:
  BarrierBook(NodeRoster& roster, ControlReplies& replies) : roster_(roster), replies_(replies) {}

  // A node's BARRIER from connection `peer` (a gather too large is refused), then Check.
  void Arrive(const std::string& peer, const ControlMessage& c);
  // Releases the barriers every live member reached, and gives up those one never will; after
  // every change of membership (a node dead, finished, or one that ended training).
  void Check();

 private:
  // A member of `barrier` that has not arrived and ended training without joining, while a
  // worker that still trains waits there: it never comes. Null when none.
  const NodeRecord* EndedAbsent(const std::vector<NodeRecord*>& members, const std::string& barrier) const;

  NodeRoster& roster_;
  ControlReplies& replies_;
  std::map<std::string, std::set<std::string>> arrivals_;            // name -> identities
  std::map<std::string, std::map<std::string, std::string>> data_;  // name -> identity -> gather data
  std::map<std::string, std::string> group_;
};

}  // namespace gradsync
