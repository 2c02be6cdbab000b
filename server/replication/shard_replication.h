// ShardReplication: what one shard server does for --replicas (replication.h has the protocol).
//
// As a primary it listens to its ShardCore's events (ShardEvents) and writes each change to its
// backups' log: a counted push (its decoded values, as the core applies them), an applied round,
// a membership change, an optimizer state a worker set; every entry carries the consistency
// state after it. New or out-of-step backups get a snapshot (the core's Snapshot, then the
// pushes the open round holds). A worker's reply waits (HoldReply) until every live backup holds
// what it acknowledges. As a backup it keeps copies of other shards (ReplicaStore) and says
// which dead shard's copy this server should take over. With one replica (the default) it does
// nothing and costs nothing.
//
// Backups of shard s: BackupRanks(s) that are live and not served by this process, and every
// standby; a standby backs up every shard and serves none.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "common/ps/consistency.h"
#include "gradsync.pb.h"
#include "server/replication/replication.h"
#include "server/shard/shard_core.h"

namespace gradsync {

// The ranks one process serves (its own, the shards it took over, a standby's): a backup in the
// same process would not survive what it is there for.
class Colocated {
 public:
  void Add(int rank) {
    std::lock_guard lock(mu_);
    ranks_.insert(rank);
  }
  bool Has(int rank) const {
    std::lock_guard lock(mu_);
    return ranks_.count(rank) > 0;
  }

 private:
  mutable std::mutex mu_;
  std::set<int> ranks_;
};

// What replication counts, for the server's summary.
struct ReplicationCounts {
  int64_t sent = 0;      // entries sent to backups
  int64_t received = 0;  // entries applied as a backup
};

class ShardReplication : public ShardEvents {
 public:
  // Shard `rank` of a job with `table`'s servers and replicas; `standby`: this server keeps
  // copies only. `colocated`: the ranks this process serves.
  ShardReplication(TransportContext& ctx, int rank, const wire::ClusterTable& table, ConsistencyMode mode,
                   int staleness, std::string key, bool standby, std::shared_ptr<Colocated> colocated);

  bool on() const { return replicas_ > 1; }
  // Backups hold this shard's changes now: a worker's reply waits for them (HoldReply).
  bool active() const { return replicator_ && replicator_->active(); }
  const ReplicationCounts& counts() const { return counts_; }

  // Primary side: the core's changes as entries (ShardEvents; nothing before the core is built).
  void Pushed(const ShardCore& core, int worker, const HeldPush& push, float scale) override;
  void RoundApplied(const ShardCore& core, const ShardCore::Round& round) override;
  void MembershipChanged(const ShardCore& core, int worker) override;
  void OptimizerSet(const ShardCore& core, int worker) override;
  void ParamsSet(const ShardCore& core, int worker) override;
  // `reply` to `peer` once every backup holds the last entry sent.
  void HoldReply(std::string peer, wire::Header reply);
  // The backups now (from the scheduler's table and news); new ones get a snapshot.
  void UpdateBackups(const SchedulerClient& scheduler, const ShardCore& core, const ShardIdentity& id);
  // Snapshots to the backups that need one (new, or out of step).
  void SendSnapshots(const ShardCore& core, const ShardIdentity& id);
  // The backups' links, to wait on with the data socket.
  std::vector<Socket*> sockets();
  // From the loop: acknowledgements in (the replies they release sent on `socket`), snapshots out,
  // a backup's delayed acknowledgements (tests) sent when due.
  void Poll(Socket& socket, const ShardCore& core, const ShardIdentity& id);

  // Backup side: a REPLICATE entry from a primary, applied to its copy; the reply
  // (REPLICATE_REPLY, or ERROR saying why) goes on `socket`. Returns why it was refused.
  Status HandleEntry(const Message& m, const SchedulerClient& scheduler, Socket& socket);
  // Dead server `dead`'s copy, when this server is the first live one in its backups' order (its
  // ranks, then the standbys) and holds a whole copy; it leaves the store.
  std::optional<ReplicaCopy> TakeOver(int dead, const SchedulerClient& scheduler);
  // Every dead server whose shard this one should take over now.
  std::vector<int> DeadShards(const SchedulerClient& scheduler) const;
  // Came back as a standby of rank `rank`: no backups of its own, fresh copies from the
  // primaries' snapshots.
  void BecomeStandby(int rank);

 private:
  // An entry carrying the consistency state after it.
  ReplicaEntry Entry(wire::ReplicaOp op, const ShardCore& core) const;
  // One chunk of a push as an entry (its values in *p, read in place).
  ReplicaEntry PushEntry(const ShardCore& core, int worker, const PushChunk& c, bool last, float lr, float scale,
                         Payload* p) const;

  int rank_;
  int servers_;
  int replicas_;
  bool standby_;
  std::shared_ptr<Colocated> colocated_;
  std::unique_ptr<Replicator> replicator_;  // this shard's backups
  std::unique_ptr<ReplicaStore> store_;     // the copies held here of other shards
  TestAckDelay ack_delay_;                  // a test's delay of the acknowledgements sent as a backup
  ConsistencyMode mode_;
  int staleness_;
  std::string key_;
  ReplicationCounts counts_;
};

}  // namespace gradsync
