// SchedulerClient: a node's link to the scheduler (rendezvous, barriers, heartbeats, news of
// dead nodes, of workers that ended training, and shutdown). Used by servers and workers alike.
//
// A node the scheduler declared dead (it was silent too long) hears so on its next message and
// reports itself unhealthy (kAborted); a restarted node may take a dead one's rank (rejoined()).
//
// The face of its parts, each with its own state and lock: SchedulerLink (the connection: one
// background thread owns the socket, sends heartbeats and what the node queued, judges the
// scheduler's silence), JobStanding (healthy or why not, shutdown, the event counter),
// Registration (this node's rank), JobNews (the table, dead, rejoined and ended nodes: news()),
// BarrierWaits (barriers, gathers, the message limit) and ClockEstimate (the scheduler's clock:
// clock()). The client's thread hands each message from the scheduler to the part it concerns.
// Lock order: a part's mutex, then JobStanding's (a leaf); no path holds two parts' mutexes.
// Public methods are thread-safe and never wait past their timeout.
//
//   SchedulerClient sc(ctx, options);
//   ASSIGN_OR_RETURN(wire::ClusterTable table, sc.Register(60));
//   RETURN_IF_ERROR(sc.Barrier("init", "workers", 60));
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/client/barrier_waits.h"
#include "common/net/control/client/clock_estimate.h"
#include "common/net/control/client/job_news.h"
#include "common/net/control/client/job_standing.h"
#include "common/net/control/client/registration.h"
#include "common/net/control/client/scheduler_link.h"
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

class SchedulerClient {
 public:
  SchedulerClient(TransportContext& ctx, SchedulerClientOptions options);
  SchedulerClient(const SchedulerClient&) = delete;
  SchedulerClient& operator=(const SchedulerClient&) = delete;

  // Registers and waits until every node of the job has: returns the cluster table (this node's
  // rank is rank()). Errors: the scheduler's refusal (e.g. a mode mismatch, kInvalidArgument),
  // kDeadlineExceeded, kUnavailable (scheduler lost). Then estimates the scheduler's clock from
  // kClockProbes probes (clock()).
  Result<wire::ClusterTable> Register(double timeout_s);
  int rank() const;
  // This node took a dead node's rank in a running job (its Register returned then).
  bool rejoined() const;
  // A server: the job's replication key (REGISTER_REPLY), "" until registered and for workers.
  std::string replica_key() const;
  // The cluster table as of now (rejoined nodes' new addresses included).
  wire::ClusterTable table() const;

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
  // Bumps each time something changes (a death, a rejoin, a worker that ended training, a
  // shutdown, a lost scheduler, this node declared dead): cheap to poll.
  uint64_t events() const { return standing_.events(); }
  // Dead now (declared dead and not rejoined since).
  bool IsDead(wire::Role role, int rank) const;
  // JobNews::set_on_dead: a callback on the client's thread for each node declared dead.
  void set_on_dead(std::function<void(const wire::NodeInfo&)> fn);
  // SchedulerLink::set_on_unhealthy: a callback on the client's thread once health() turns non-OK.
  void set_on_unhealthy(std::function<void(const Status&)> fn);
  TrafficCounters traffic() const;

  // The scheduler's news of the job's members: dead_nodes(), joined_nodes(), ended_workers().
  const JobNews& news() const { return news_; }
  // The scheduler's clock: offset_us(), rtt_us(), Estimate(probes, timeout_s) (a process about
  // to write its trace refines the offset with more probes).
  ClockEstimate& clock() { return clock_; }
  static constexpr int kClockProbes = 16;

 private:
  // The client's thread: a message from the scheduler, to the part it concerns.
  void Handle(const ControlMessage& c);

  SchedulerClientOptions options_;
  JobStanding standing_;
  Registration registration_;
  JobNews news_;
  BarrierWaits barriers_;
  SchedulerLink link_;
  ClockEstimate clock_;
  std::jthread thread_;  // runs link_ (last: it stops before any part goes)
};

}  // namespace gradsync
