// JobNews: what the scheduler says about the job's members, as this node hears it: the cluster
// table (as registered, with rejoined nodes' new addresses, standbys and the shards' message
// limit), the nodes it declared dead (and which of them are dead now), the restarted nodes that
// took a dead node's rank, and the workers that ended training; and the callback run for each
// node declared dead. Every piece of news is an event (JobStanding::Bump), counted once it can
// be read.
//
// Lock order: its mutex is taken alone (never with another of the client's); the callback's
// mutex is held only while the callback runs or is replaced.
#pragma once

#include <functional>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "common/net/control/client/job_standing.h"
#include "common/net/control/control_protocol.h"
#include "gradsync.pb.h"

namespace gradsync {

// A worker that ended training, as the scheduler relayed it (TRAINING_ENDED).
struct EndedWorker {
  int rank = -1;
  int64_t clock = 0;    // the steps it pushed
  bool joined = false;  // it left the consistency rule (a frontend's join())
};

class JobNews {
 public:
  explicit JobNews(JobStanding& standing) : standing_(standing) {}
  JobNews(const JobNews&) = delete;
  JobNews& operator=(const JobNews&) = delete;

  // What the scheduler says (on the client's thread).
  void Registered(const wire::ClusterTable& table);  // REGISTER_REPLY
  void Dead(const wire::NodeInfo& n);                // NODE_DEAD; runs the callback after
  void Joined(const wire::NodeInfo& n);              // NODE_JOINED
  void Ended(const ControlMessage& c);               // TRAINING_ENDED (a bad one dropped, said)
  void ShardLimit(uint64_t bytes);                   // SHARD_LIMIT

  // Nodes the scheduler has declared dead, in the order it did.
  std::vector<wire::NodeInfo> dead_nodes() const;
  // Restarted nodes that took a dead node's rank (NODE_JOINED), in order; the table follows them.
  std::vector<wire::NodeInfo> joined_nodes() const;
  // Workers that ended training (TRAINING_ENDED), in the order the scheduler said so.
  std::vector<EndedWorker> ended_workers() const;
  // Dead now (declared dead and not rejoined since).
  bool IsDead(wire::Role role, int rank) const;
  // The cluster table as of now (rejoined nodes' new addresses included).
  wire::ClusterTable table() const;

  // Called on the client's thread for each node the scheduler declares dead from now on (null:
  // none). It must not call back into the client; once set_on_dead returns, the previous
  // callback is not running and will not run again (so its captures may go).
  void set_on_dead(std::function<void(const wire::NodeInfo&)> fn);

 private:
  JobStanding& standing_;
  mutable std::mutex mu_;
  wire::ClusterTable table_;
  std::vector<wire::NodeInfo> dead_;
  std::vector<wire::NodeInfo> joined_;
  std::vector<EndedWorker> ended_;
  std::set<std::pair<int, int>> dead_now_;  // (role, rank)
  std::mutex on_dead_mu_;  // held while on_dead_ runs, and to replace it
  std::function<void(const wire::NodeInfo&)> on_dead_;
};

}  // namespace gradsync
