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
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/control_protocol.h"
#include "common/net/transport.h"
#include "gradsync.pb.h"
#include "server/scheduler/barrier_book.h"
#include "server/scheduler/control_replies.h"
#include "server/scheduler/job_terms.h"
#include "server/scheduler/node_roster.h"
#include "server/scheduler/shard_copies.h"

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
  using Node = NodeRecord;

  Scheduler(SchedulerOptions options, Socket socket)
      : options_(std::move(options)),
        socket_(std::move(socket)),
        terms_(options_.mode, options_.staleness),
        replies_(socket_),
        barriers_(roster_, replies_),
        copies_(options_.num_servers, options_.replicas) {}
  void Handle(Message& m, double now);
  void HandleRegister(const std::string& peer, const ControlMessage& c, double now);
  void HandleFinished(Node& n, const ControlMessage& c);
  // After the job started: a restarted node takes a dead node's rank (elastic membership).
  void HandleRejoin(const std::string& peer, const ControlMessage& c, const std::string& who, double now);
  void AssignRanksAndAnnounce();
  void CheckHeartbeats(double now);
  // Shards none of whose copies lives (ShardCopies::NoLiveCopy). A shard whose server kept
  // checkpoints waits for that server's restart, said once; any other is lost for good: the job
  // fails at once (lost_), every node told, naming the shards.
  void CheckShards(double now);
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
  void Broadcast(const ControlMessage& c);
  bool JobOver() const;

  SchedulerOptions options_;
  Socket socket_;
  std::atomic<bool> stop_{false};
  JobTerms terms_;         // what the job runs, and its identity
  NodeRoster roster_;      // the nodes, by slot and connection
  ControlReplies replies_;
  BarrierBook barriers_;   // the open barriers
  bool announced_ = false;
  wire::ClusterTable table_;
  std::set<std::string> limit_waiters_;  // identities of workers waiting for MESSAGE_LIMIT's answer
  std::set<int> awaiting_restart_;  // shards with no live copy whose server's restart is awaited
  ShardCopies copies_;  // which server process holds which shard's copy
  Status lost_;                     // a shard lost for good: the job failed
};

}  // namespace gradsync
