// ShardCopies: which server process holds a copy of which shard (--replicas), followed through
// takeovers, restarts and standbys as the servers place their copies, and the verdict on a shard
// whose server is dead: its takeover is due (or awaited a while), or it has no live copy. The
// scheduler tells it what happened to its server nodes and asks; no sockets, no clock of its own.
//
// How the servers place copies (server/replication/): at the start each server holds the shards it
// backs up (BackupRanks); a server joining the running job gets a copy of every shard it backs up
// whose primary lives (a snapshot the primary sends when it hears of it), and, serving a shard,
// gives one to each of that shard's live backups; a process keeps no copy of a shard it serves. A
// shard server a backup starts to take a dead rank over runs in the backup's process (they die
// together), its copy leaving the backup's store for it. The first live server in a shard's
// takeover order (its backup ranks, then the standbys; ShardReplication::TakeOver decides alike)
// takes it over.
//
//   ShardCopies copies(num_servers, replicas);
//   copies.Start(servers);  ...  copies.Died(slot);  ...  if (auto why = copies.NoLiveCopy(servers,
//   s, now)) ...
//
// Threading: the scheduler's.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gradsync {

// How long a dead shard's takeover may take: from the moment the backup that holds its copy is
// next in line (the shard's primary declared dead) to the backup's shard server registering for
// the rank (a few ms on loopback). A copy the scheduler cannot rule out may still be missing (its
// primary died before the snapshot reached a backup that came after it): no takeover then
// comes, and the shard is lost when this has passed.
inline constexpr double kTakeoverGraceS = 2.0;

// A server node as the scheduler sees it: its slot (the scheduler's index for it, which a
// restarted node takes again), rank (a standby's comes after the shards'), whether it is a
// standby and whether it was declared dead, and its name for messages.
struct ServerSlot {
  size_t slot = 0;
  int rank = 0;
  bool standby = false;
  bool dead = false;
  std::string name;
};

class ShardCopies {
 public:
  ShardCopies(int num_servers, int replicas) : num_servers_(num_servers), replicas_(replicas) {}

  // The job is complete: every server in a process of its own, holding the shards it backs up.
  void Start(const std::vector<ServerSlot>& servers);
  // A server took slot `slot` again (restarted; `adopted`: a backup's takeover of the rank, in
  // that backup's process, whose copy of the shard leaves it). Its copies come with Announced.
  void Rejoined(const std::vector<ServerSlot>& servers, size_t slot, bool adopted);
  // A new standby in slot `slot`, a process of its own; its copies come with Announced.
  void NewStandby(size_t slot);
  // Server `slot` joined the running job (its data socket listens): the live primaries send it
  // their snapshots, and it sends its own shard's to that shard's live backups.
  void Announced(const std::vector<ServerSlot>& servers, size_t slot);
  // Server `slot` was declared dead: its process is (its other shard servers follow).
  void Died(size_t slot);

  // Shard `shard`'s server is dead (`servers` as they are now, at `now`): nothing while its
  // takeover is due or awaited (at most kTakeoverGraceS from when the server next in line holds a
  // copy); otherwise why no live copy exists, naming the dead servers and the one next in line.
  std::optional<std::string> NoLiveCopy(const std::vector<ServerSlot>& servers, int shard,
                                        double now);
  // Shard `shard`'s server lives: no takeover is awaited.
  void Served(int shard) { takeovers_.erase(shard); }

 private:
  struct Process {
    int id = -1;
    std::set<int> copies;  // the shards it holds a copy of (not the one it serves)
  };
  struct Takeover {
    size_t slot;
    double due;
  };
  const ServerSlot* ShardServer(const std::vector<ServerSlot>& servers, int shard) const;
  // Whether no server of process `id` was declared dead: a process dies whole, and its other
  // shard servers are declared dead a heartbeat or so later.
  bool ProcessLives(int id) const { return !dead_processes_.count(id); }
  // Whether live process `id` serves shard `shard` (then it keeps no copy of it).
  bool ServesShard(const std::vector<ServerSlot>& servers, int id, int shard) const;
  bool BacksUp(const ServerSlot& s, int shard) const;
  std::vector<const ServerSlot*> TakeoverOrder(const std::vector<ServerSlot>& servers,
                                               int shard) const;

  const int num_servers_;
  const int replicas_;
  std::map<size_t, Process> of_slot_;  // each server slot's process
  int processes_ = 0;                  // processes seen
  std::set<int> dead_processes_;       // those with a server declared dead
  std::map<int, Takeover> takeovers_;  // dead shards whose takeover is awaited
};

}  // namespace gradsync
