// Shard replication (gradsync-server --role=scheduler --replicas=R): primary-backup, as in the
// OSDI 2014 parameter server's chain replication, with the backups written to in parallel.
//
// Shard s's backups are the servers of ranks s+1 .. s+R-1 (mod the number of servers). The
// primary sends each backup a snapshot of the shard (META, PARAMS, STATE entries, then the pushes
// a bsp round holds) and from then on every change as it makes it, in order: each accepted push
// (its decoded values, exactly as the shard applies them), each applied round, each membership
// change, each optimizer state a worker set (its vectors; the copy takes them at the last). Every entry carries the consistency state after it. A backup replays the entries on
// its own ShardCore (server/shard/shard_core.h: the primary's apply path), so its copy is bit for bit the primary's, and acknowledges each one. A push is
// acknowledged to its worker only once every live backup holds it (Replicator::Hold): no
// acknowledged update exists on the primary alone. When the primary dies the first live backup
// takes its rank (server.h, Adopt) from its copy; workers follow it as they follow a restarted
// shard. A backup that falls out of step (a gap, an entry it cannot apply) answers ERROR and the
// primary sends it a fresh snapshot; a dead backup is dropped, so a push never waits on it.
//
// Who may write a copy: a snapshot (META) is taken only with the job's replication key (which the
// scheduler tells servers alone) and from the shard's own rank, and binds the copy to the
// connection it came on; every other entry is applied only from that connection. Anything else
// (a stranger's entries, another connection's, a replay from elsewhere) is refused and leaves
// the copy as it was. The server also refuses a snapshot while the scheduler says the shard's
// primary is dead (server.cc, HandleReplicate).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/consistency.h"
#include "common/ps/replica_protocol.h"
#include "gradsync.pb.h"
#include "server/shard/push_assembler.h"
#include "server/shard/shard_core.h"

namespace gradsync {

// The ranks whose servers back shard `shard` up (besides every standby), in the order they take
// it over: shard+1 .. shard+replicas-1, mod the number of servers. The scheduler, the primary
// and the backups all place copies by this.
std::vector<int> BackupRanks(int shard, int replicas, int servers);

// A test hook on the backup's side: every acknowledgement it sends is held back
// GRADSYNC_TEST_REPLICA_ACK_DELAY_MS (read once; without it nothing is held) while the backup
// goes on serving, which shows that no push is acknowledged to its worker before its backups
// hold it.
class TestAckDelay {
 public:
  TestAckDelay();
  // Takes `reply` to send to `peer` when due: false (the caller sends it now) without a delay.
  bool Defer(const std::string& peer, const wire::Header& reply);
  // Sends the replies that are due, in order.
  void SendDue(Socket& socket);

 private:
  struct Held {
    double due_ms;
    std::string peer;
    wire::Header reply;
  };
  double delay_ms_;
  std::deque<Held> held_;
};

// A copy taken over by a backup: the shard as a checkpoint, and the pushes of the open round.
struct ReplicaCopy {
  wire::ShardCheckpoint checkpoint;
  std::map<int, HeldPush> held;
};

// Backup side: the copies this server keeps of other shards.
class ReplicaStore {
 public:
  // `mode`, `staleness`: the job's consistency rule; `key`: the job's replication key
  // (SchedulerClient::replica_key).
  ReplicaStore(int num_servers, ConsistencyMode mode, int staleness, std::string key)
      : num_servers_(num_servers), mode_(mode), staleness_(staleness), key_(std::move(key)) {}
  // Applies one REPLICATE entry. kPermissionDenied: not from the shard's primary (a META without
  // the key or not from the shard's rank; another entry not from the connection of the copy's
  // META): the copy is untouched. Another error means the copy is out of step (the primary
  // resends a snapshot); the copy is then incomplete until it does.
  Status Apply(const Message& m);
  // The same, for an entry already decoded from m.
  Status Apply(const ReplicaEntry& e, const Message& m);
  // A whole copy of `shard` is here (a snapshot and every entry since).
  bool Complete(int shard) const;
  // The copy, for a takeover; it leaves the store.
  Result<ReplicaCopy> Take(int shard);
  // Forgets the copy of `shard` (its primary moved here, or it is no longer backed up here).
  void Drop(int shard) { copies_.erase(shard); }
  std::vector<int> shards() const;
  // The copy's parameters as they are (empty: no copy), for checks.
  std::span<const float> params(int shard) const;

 private:
  struct Copy {
    wire::ShardCheckpoint meta;  // the snapshot's counters; the shard, the rule and the round live in `core`
    std::string sender;          // the connection its META came on: the only one it takes entries from
    std::unique_ptr<ShardCore> core;  // replays the primary's pushes and rounds as the primary's own core did
    uint64_t seq = 0;            // the primary's log position the copy holds
    uint64_t index = 0;          // the last entry applied, counted from the snapshot's META
    int state_parts = 0;         // optimizer state vectors still to come
    bool params = false;         // the snapshot's parameters came
    // A worker's optimizer state set (REPLICA_OPTIMIZER), its vectors until the last has come.
    std::vector<float> staged_state;
    int staged_next = 0;
  };
  Status ApplyTo(Copy& c, const ReplicaEntry& e, const Message& m);
  Status ApplySnapshotPart(Copy& c, const ReplicaEntry& e, const Message& m);  // REPLICA_PARAMS, REPLICA_STATE
  Status ApplyPush(Copy& c, const ReplicaEntry& e, const Message& m);
  Status ApplyOptimizer(Copy& c, const ReplicaEntry& e, const Message& m);  // REPLICA_OPTIMIZER

  int num_servers_;
  ConsistencyMode mode_;
  int staleness_;
  std::string key_;
  std::map<int, Copy> copies_;
};

// Primary side: links to the backups of one shard, entries out, acknowledgements in, and the
// worker replies that wait for them.
class Replicator {
 public:
  // `key`: the job's replication key, sent with every snapshot.
  Replicator(TransportContext& ctx, int shard, std::string key) : ctx_(ctx), shard_(shard), key_(std::move(key)) {}

  // The backups now (rank -> address). New ones (or new addresses) get a link that needs a
  // snapshot; links to ranks no longer listed are dropped, and replies no longer wait for them.
  void SetBackups(const std::map<int, wire::NodeInfo>& backups);
  bool active() const {
    for (const auto& [rank, link] : links_)
      if (!link.refused) return true;
    return false;
  }
  // Backups that need a snapshot (new, or out of step): the caller sends one with SendTo.
  std::vector<int> NeedSnapshot() const;
  void SnapshotSent(int backup);
  // Sends an entry to every backup in step; returns its sequence number (the log's position
  // after it). A link whose send fails needs a snapshot.
  uint64_t Send(ReplicaEntry e, const Payload& p = {});
  // One entry of a snapshot to one backup (META first): it holds the log up to last_seq().
  void SendSnapshotEntry(int backup, ReplicaEntry e, const Payload& p = {});
  // A reply to `peer` that may leave once every backup holds entry `seq`.
  void Hold(uint64_t seq, std::string peer, wire::Header reply);
  // Reads the backups' acknowledgements (without waiting) and sends the replies they release
  // on `socket`.
  void Poll(Socket& socket);
  // The links' sockets, to wait on with the shard's own.
  std::vector<Socket*> sockets();
  uint64_t last_seq() const { return seq_; }
  size_t waiting() const { return held_.size(); }

 private:
  struct Link {
    std::string endpoint;
    std::unique_ptr<Socket> socket;
    uint64_t acked = 0;
    uint64_t index = 0;  // of the next entry sent on this link
    bool needs_snapshot = true;
    bool refused = false;  // it answered that it keeps no copy of this shard
  };
  struct Waiting {
    uint64_t seq;
    std::string peer;
    wire::Header reply;
  };
  void Stamp(ReplicaEntry* e, uint64_t seq) const;
  void SendOn(int backup, Link& link, ReplicaEntry e, const Payload& p);
  void Release(Socket& socket);

  TransportContext& ctx_;
  int shard_;
  std::string key_;
  uint64_t seq_ = 0;
  std::map<int, Link> links_;
  std::vector<Waiting> held_;  // in sequence order
};

}  // namespace gradsync
