// Scheduler: the control plane of a job (registration, ranks, the cluster table, barriers,
// heartbeats, orderly shutdown). No data goes through it.
//
// Nodes register with their role, advertised address, mode and staleness (and workers with a
// fingerprint of the settings that must agree: common/config/train_config.h's JobFingerprint). The first
// node fixes the job's mode; a node that disagrees is refused with an error naming both (for
// worker settings, the ones that differ). An ssp node that sends staleness -1 (a worker started
// without --staleness) takes the job's bound, which it finds in the table. Once num_servers servers and num_workers
// workers have registered, ranks are assigned deterministically (requested ranks first, then by
// address) and every node gets the table. Every message from a node counts as a heartbeat; a node
// silent for heartbeat_timeout_s is declared dead, by name, to every live node (time the scheduler
// itself was paused, kPausedS and more between two turns, does not count, and what waits in its
// socket is heard before anyone is judged); a message from it
// afterwards is answered with an error (it stops). A shard with no live copy (its server dead, and
// no live server process holding a copy of it: the scheduler follows which process holds which
// shard's copy through takeovers, restarts and standbys) waits for its server's restart when that
// server kept checkpoints, and says so; otherwise nothing can bring it back: the job fails at
// once, every node told why (SHUTDOWN with kDataLoss, naming the shards). Elastic membership: once the job has started, a
// restarted node registering with the same role takes a dead node's rank (the one it asks for,
// else the first), gets the updated table with `rejoined` set, and every other node hears
// NODE_JOINED (a server once its data socket accepts the job's message limit). Before workers
// connect to the shards they say how large their messages are (MESSAGE_LIMIT): the first sets the
// job's limit, the servers raise their sockets' limit to it, and the workers are answered when
// every live server has (LISTENING). A worker that ends training says so with its clock
// (TRAINING_ENDED, and whether it leaves the consistency rule: a frontend's join()); every node
// hears it, a node that rejoins later too. The job ends when every worker has finished (or died):
// the scheduler tells every node to shut down.
//
// Single-threaded: Run() owns the socket. Stop() may be called from another thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/control_protocol.h"
#include "common/net/transport.h"
#include "server/scheduler/shard_copies.h"
#include "gradsync.pb.h"

namespace gradsync {

// A gap this long between two turns of the scheduler's loop (each waits at most 50 ms) is a pause
// of the scheduler itself, not counted against the nodes; and the most messages one turn handles.
inline constexpr double kPausedS = 1.0;
inline constexpr int kDrainPerTurn = 4096;

struct SchedulerOptions {
  std::string bind_host = "127.0.0.1";
  uint16_t port = 0;  // 0: ephemeral (see Scheduler::port())
  int num_servers = 1;
  int num_workers = 1;
  std::string mode;   // "" = whatever the first node says
  int staleness = -1; // ssp: the bound nodes must use; -1 = whatever the first ssp node says
  double heartbeat_timeout_s = 10.0;
  double register_timeout_s = 300.0;  // give up when the job never fills up
  int replicas = 1;                   // copies of every shard (1: no backups)
};

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> Create(TransportContext& ctx, const SchedulerOptions& options);

  uint16_t port() const { return socket_.port(); }

  // Runs the job to its end. OK when at least one worker finished successfully and none failed
  // (workers that died and never came back are named in a warning); otherwise an error that names
  // the workers that failed or died, and any dead server.
  Status Run();
  void Stop() { stop_.store(true); }

 private:
  struct Node {
    wire::NodeInfo info;
    std::string identity;
    double last_seen = 0;
    bool dead = false;
    double dead_at = 0;  // when it was declared dead
    bool finished = false;
    Status result;
    int rejoins = 0;
    int64_t listening = 0;              // servers: the message size their data socket accepts
    bool announce_when_listening = false;  // a restarted server: NODE_JOINED once it accepts the job's
    // A worker that ended training (TRAINING_ENDED): its clock (-1: it has not), and whether it
    // left the consistency rule (join).
    int64_t ended_clock = -1;
    bool ended_joined = false;
  };

  Scheduler(SchedulerOptions options, Socket socket)
      : options_(std::move(options)), socket_(std::move(socket)), copies_(options_.num_servers, options_.replicas) {}
  void Handle(Message& m, double now);
  void HandleRegister(const std::string& peer, const ControlMessage& c, double now);
  // After the job started: a restarted node takes a dead node's rank (elastic membership).
  // A restarted node's slot: a dead node of its role (the rank it asks for, else the first).
  Node* DeadSlotFor(const wire::NodeInfo& info);
  // The live (not finished) node of `role` and `rank`, if any.
  Node* LiveNode(wire::Role role, int rank);
  void HandleBarrier(const std::string& peer, const ControlMessage& c);
  void HandleFinished(Node& n, const ControlMessage& c);
  void HandleRejoin(const std::string& peer, const ControlMessage& c, const std::string& who, double now);
  void AssignRanksAndAnnounce();
  void CheckBarriers();
  // A member of `barrier` that has not arrived and ended training without joining, while a
  // worker that still trains waits there: it never comes. Null when none.
  const Node* EndedAbsent(const std::vector<Node*>& members, const std::string& barrier) const;
  void CheckHeartbeats(double now);
  // Shards none of whose copies lives (ShardCopies::NoLiveCopy). A shard whose server kept
  // checkpoints waits for that server's restart, said once; any other is lost for good: the job
  // fails at once (lost_), every node told, naming the shards.
  void CheckShards(double now);
  // The server nodes as ShardCopies sees them, in slot order.
  std::vector<ServerSlot> ServerSlots() const;
  // Message limits: a worker's MESSAGE_LIMIT (the first sets the job's, which every server hears),
  // a server's LISTENING; workers are answered once every live server accepts the job's limit.
  void HandleMessageLimit(Node& n, const ControlMessage& c);
  void HandleListening(Node& n, const ControlMessage& c);
  void CheckMessageLimit();
  // A worker's TRAINING_ENDED: recorded and relayed to every node (and to nodes that rejoin).
  void HandleTrainingEnded(Node& n, const ControlMessage& c);
  ControlMessage TrainingEndedNews(const Node& n) const;
  void AnnounceJoined(const Node& n);
  // A node back in the running job: the table, its place, and the nodes dead now.
  void WelcomeBack(const std::string& peer, const wire::NodeInfo& info);
  // A server whose shard a backup took over comes back: a standby (NodeInfo.standby).
  void AddStandby(const std::string& peer, const ControlMessage& c, const std::string& who, const Node& taken,
                  double now);
  void Reply(const std::string& peer, ControlMessage c);
  void ReplyError(const std::string& peer, const Status& s);
  void Broadcast(const ControlMessage& c);
  bool JobOver() const;
  std::vector<Node*> Members(const std::string& group);

  SchedulerOptions options_;
  Socket socket_;
  std::atomic<bool> stop_{false};
  std::string mode_;
  int staleness_ = -1;  // -1 until known
  std::string mode_source_;
  std::string fingerprint_;
  std::string fingerprint_source_;
  std::vector<Node> nodes_;
  std::map<std::string, size_t> by_identity_;
  bool announced_ = false;
  wire::ClusterTable table_;
  std::map<std::string, std::set<std::string>> barrier_arrivals_;  // name -> identities
  std::map<std::string, std::map<std::string, std::string>> barrier_data_;  // name -> identity -> gather data
  std::map<std::string, std::string> barrier_group_;
  std::string job_id_;  // drawn at Create: this run of the job, in every checkpoint
  std::string replica_key_;  // drawn at Create: told to servers only (wire::ControlFields.replica_key)
  std::map<std::string, std::string> replaced_;  // identity of a node whose rank another took -> its name
  std::set<std::string> limit_waiters_;  // identities of workers waiting for MESSAGE_LIMIT's answer
  std::set<int> awaiting_restart_;  // shards with no live copy whose server's restart is awaited
  ShardCopies copies_;  // which server process holds which shard's copy
  Status lost_;                     // a shard lost for good: the job failed
};

}  // namespace gradsync
