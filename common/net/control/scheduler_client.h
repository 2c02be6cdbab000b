// SchedulerClient: a node's link to the scheduler (rendezvous, barriers, heartbeats, news of
// dead nodes, of workers that ended training, and shutdown). Used by servers and workers alike.
//
// A node the scheduler declared dead (it was silent too long) hears so on its next message and
// reports itself unhealthy (kAborted); a restarted node may take a dead one's rank (rejoined()).
//
// One background thread owns the ZeroMQ socket to the scheduler: it sends a heartbeat every
// `heartbeat_interval_s`, forwards requests made by the node's main thread, and records what the
// scheduler says. The scheduler answers every heartbeat; when it has been silent for
// `scheduler_timeout_s` and its connection is closed (it died: its kernel closed it) the client
// reports it lost, so that a node never outlives its job. A scheduler that is silent with its
// connection up (paused, starved of CPU: it judges nobody meanwhile, see Scheduler) gets up to
// kSchedulerUpFactor timeouts, said once in the log.
// Public methods are thread-safe and never wait past their timeout.
//
//   SchedulerClient sc(ctx, options);
//   ASSIGN_OR_RETURN(wire::ClusterTable table, sc.Register(60));
//   RETURN_IF_ERROR(sc.Barrier("init", "workers", 60));
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/control_protocol.h"
#include "common/net/transport.h"
#include "gradsync.pb.h"

namespace gradsync {

// The most data one node contributes to a gather (SchedulerClient::Gather).
inline constexpr size_t kMaxGatherBytes = size_t{1} << 20;
// The workers' barrier at the end of training (PS modes), which a worker that ended training
// still comes to.
inline constexpr char kTrainedBarrier[] = "trained";
// ...and a BARRIER carrying it (its header fields besides) is a control message.
static_assert(kMaxGatherBytes + (64 << 10) <= kMaxControlMessageBytes);

// A worker that ended training, as the scheduler relayed it (TRAINING_ENDED).
struct EndedWorker {
  int rank = -1;
  int64_t clock = 0;    // the steps it pushed
  bool joined = false;  // it left the consistency rule (a frontend's join())
};

struct SchedulerClientOptions {
  std::string scheduler_endpoint;   // tcp://host:port
  wire::NodeInfo self;              // role, advertised host/port, requested rank
  std::string mode;                 // bsp | ssp | asp | allreduce
  int staleness = 0;
  std::string job_fingerprint;      // workers: settings that must agree across the job
  double heartbeat_interval_s = 1.0;
  double scheduler_timeout_s = 10.0;
};

// How many scheduler timeouts a node waits for a silent scheduler whose connection is up.
inline constexpr double kSchedulerUpFactor = 3.0;

class SchedulerClient {
 public:
  SchedulerClient(TransportContext& ctx, SchedulerClientOptions options);
  ~SchedulerClient();
  SchedulerClient(const SchedulerClient&) = delete;
  SchedulerClient& operator=(const SchedulerClient&) = delete;

  // Registers and waits until every node of the job has: returns the cluster table (this node's
  // rank is rank()). Errors: the scheduler's refusal (e.g. a mode mismatch, kInvalidArgument),
  // kDeadlineExceeded, kUnavailable (scheduler lost).
  Result<wire::ClusterTable> Register(double timeout_s);
  int rank() const;

  // Waits until every live member of `group` ("workers" or "all") reached barrier `name`.
  Status Barrier(const std::string& name, const std::string& group, double timeout_s);
  // A barrier that also gathers: returns every live member's `data` (at most kMaxGatherBytes),
  // entry r from the member of rank r (an empty entry: no such live member). For small
  // agreements, such as every worker's model layout.
  Result<std::vector<std::string>> Gather(const std::string& name, const std::string& group, std::string data,
                                          double timeout_s);

  // Worker, before it connects to the shards: its largest message to or from a shard (see
  // MaxShardMessageBytes). Waits until every live shard's data socket accepts that much
  // (the first worker to ask sets the job's limit; a larger one later is refused, kFailedPrecondition).
  Status AnnounceMessageLimit(int64_t bytes, double timeout_s);
  // Server: its data socket accepts messages of `bytes` now (the scheduler lets workers connect,
  // or announces this restarted shard). Does not wait.
  void Listening(int64_t bytes);

  // Worker: its last push is answered after `clock` steps; `joined`: it leaves the consistency
  // rule (the shards go on without it but still answer its pulls). Every node hears it (a node
  // that rejoins later too). Before the "trained" barrier; does not wait.
  void TrainingEnded(int64_t clock, bool joined);
  // Worker: training is over (`status` says how it ended). Does not wait.
  void Finished(const Status& status);

  // The scheduler's steady clock minus this process's, in microseconds (0 until known): estimated
  // by Register from kClockProbes round trips, the shortest one's midpoint (error at most half
  // its round trip, clock_rtt_us), and refined by every heartbeat whose round trip is shorter
  // still. Traces add it, so that every process of a job writes the scheduler's time.
  double clock_offset_us() const;
  double clock_rtt_us() const;  // -1 until known
  static constexpr int kClockProbes = 16;
  // Sends `probes` more clock probes, one after another (at most timeout_s in all): a process
  // about to write its trace refines the offset with them.
  void EstimateClock(int probes, double timeout_s);

  // Waits (at most timeout_s) until every queued message has been handed to ZeroMQ.
  void Flush(double timeout_s);

  bool shutdown_requested() const;
  // Why the scheduler shut the job down, when it failed (SHUTDOWN with an error: a shard has no
  // live copy and nothing can restore it); OK for an orderly end or no shutdown yet.
  Status job_failure() const;
  // Non-OK once the scheduler has been silent for scheduler_timeout_s, or (kUnauthenticated)
  // once the handshake with it failed: it refused this process's key, or the keys do not match;
  // or once it shut a failed job down (job_failure).
  Status health() const;
  // Nodes the scheduler has declared dead, in the order it did.
  std::vector<wire::NodeInfo> dead_nodes() const;
  // Called on the client's thread for each node the scheduler declares dead from now on (null:
  // none). It must not call back into this client; once set_on_dead returns, the previous
  // callback is not running and will not run again (so its captures may go).
  void set_on_dead(std::function<void(const wire::NodeInfo&)> fn);
  // The same for this node's link to the job: called once, on the client's thread, when health()
  // turns non-OK (the scheduler lost or gone, this node declared dead, the job failed), so that
  // a node busy elsewhere (an all-reduce, which never asks the scheduler) stops too.
  void set_on_unhealthy(std::function<void(const Status&)> fn);
  // Restarted nodes that took a dead node's rank (NODE_JOINED), in order; the table follows them.
  std::vector<wire::NodeInfo> joined_nodes() const;
  // Workers that ended training (TRAINING_ENDED), in the order the scheduler said so.
  std::vector<EndedWorker> ended_workers() const;
  // Dead now (declared dead and not rejoined since).
  bool IsDead(wire::Role role, int rank) const;
  // The cluster table as of now (rejoined nodes' new addresses included).
  wire::ClusterTable table() const;
  // This node took a dead node's rank in a running job (its Register returned then).
  bool rejoined() const;
  // A server: the job's replication key (REGISTER_REPLY), "" until registered and for workers.
  std::string replica_key() const;
  // Bumps each time something changes (a death, a rejoin, a worker that ended training, a
  // shutdown, a lost scheduler, this node declared dead): cheap to poll.
  uint64_t events() const;

  TrafficCounters traffic() const;

 private:
  // The client thread's state between two turns of Loop.
  struct LinkState {
    std::chrono::steady_clock::time_point last_heard;
    bool heard = false;         // the scheduler has answered once: silence from then on is losing it
    bool said_waiting = false;  // the warning about a silent scheduler whose connection is up
    std::chrono::steady_clock::time_point next_beat;
  };

  void Loop(std::stop_token stop);
  // Loop's steps: sends what the node queued and the heartbeat when it is due, takes one message
  // from the scheduler (or none in 5 ms), and judges the scheduler's silence.
  void SendQueued(Socket& sock, LinkState& link);
  void ReceiveOne(Socket& sock, LinkState& link);
  void CheckSilence(Socket& sock, LinkState& link);
  void Handle(const ControlMessage& c);
  // Handle's cases that take more than a few lines, under mu_.
  void HandleError(const ControlMessage& h);
  void HandleJoined(const wire::NodeInfo& n);
  void HandleClockProbe(const ControlMessage& h);
  void Enqueue(ControlMessage c);

  SchedulerClientOptions options_;
  TransportContext& ctx_;

  mutable std::mutex mu_;
  std::mutex on_dead_mu_;  // held while on_dead_ runs, and to replace it
  std::function<void(const wire::NodeInfo&)> on_dead_;
  std::function<void(const Status&)> on_unhealthy_;  // under on_dead_mu_ as well
  bool told_unhealthy_ = false;                       // the client's thread only
  std::condition_variable cv_;
  std::deque<ControlMessage> outbox_;
  bool registered_ = false;
  Status register_error_;
  wire::ClusterTable table_;
  int rank_ = -1;
  std::set<std::string> released_;
  std::map<std::string, Status> barrier_failed_;  // barrier name -> why the scheduler gave it up
  std::map<std::string, std::vector<std::string>> gathered_;  // barrier name -> released data
  bool shutdown_ = false;
  Status job_failure_;
  Status health_;
  std::vector<wire::NodeInfo> dead_;
  std::vector<wire::NodeInfo> joined_;
  std::vector<EndedWorker> ended_;
  std::set<std::pair<int, int>> dead_now_;  // (role, rank)
  bool rejoined_ = false;
  std::string replica_key_;
  int64_t limit_accepted_ = 0;  // MESSAGE_LIMIT answered: every live shard accepts this much
  Status limit_error_;
  double clock_offset_us_ = 0;
  double clock_rtt_us_ = -1;
  int clock_probes_ = 0;  // stamped heartbeats answered
  std::atomic<uint64_t> events_{0};
  TrafficCounters traffic_;
  std::jthread thread_;
};

}  // namespace gradsync
