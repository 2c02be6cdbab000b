// A shard server's settings (ServerOptions) and its counts (ServerStats), each grouped by the
// part of the server that acts on them (server/server.h has the parts).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/net/transport.h"
#include "common/ps/consistency.h"
#include "server/channels/shard_channel.h"

namespace gradsync {

struct ReplicaCopy;
class Colocated;

// How the server registers with the scheduler and keeps its link (ServerRegistration).
struct ServerLinkOptions {
  std::string scheduler_endpoint;   // tcp://host:port
  std::string advertise_host = "127.0.0.1";
  int requested_rank = -1;
  double heartbeat_interval_s = 1.0;
  double scheduler_timeout_s = 10.0;
  double register_timeout_s = 120.0;
};

// The shard's consistency rule and how its updates run (ShardCore).
struct ShardRuleOptions {
  ConsistencyMode mode = ConsistencyMode::kBsp;
  int staleness = 0;
  // Threads that apply a large dense update together (the loop's own included; 1: it alone).
  int apply_threads = 2;
};

// The data socket workers connect to, and the value channels behind it (Server::Create,
// ShardChannels).
struct ServerChannelOptions {
  std::string bind_host = "127.0.0.1";
  uint16_t port = 0;
  // Tests: once this many pulls went over data channels, the channel of the worker of the last
  // one is dropped with that pull's frame queued, not sent (0: never).
  int64_t drop_data_channel_after_pulls = 0;
  // Tests: once this many pushes came over data channels, the channel of the worker of the last
  // one is dropped, as a frame that ends it would (0: never).
  int64_t drop_data_channel_after_pushes = 0;
  // A data-channel push: how long its frame's last bytes may take after its header came (the
  // worker sends the frame first). The shard's loop waits that long at most, then refuses it.
  double data_wait_s = 10.0;
};

// Checkpoints (off when the directory is empty): DIR/shard-<rank>.ckpt, written atomically
// every `every` updates (0: not by count) or `interval_s` seconds after the first update since
// the last one, whichever comes first. A restarted shard that rejoins the job restores from it
// (ServerCheckpoints, ServerLifecycle).
struct ServerCheckpointOptions {
  std::string dir;
  int64_t every = 0;
  double interval_s = 5.0;
};

// A backup taking over a dead shard (--replicas): the copy it starts from, and the ranks this
// process serves (shared by every Server of the process; never each other's backups)
// (ServerLifecycle).
struct ServerTakeoverOptions {
  std::shared_ptr<ReplicaCopy> restore_from;
  std::shared_ptr<Colocated> colocated;
};

struct ServerOptions {
  ServerLinkOptions link;
  ShardRuleOptions rule;
  ServerChannelOptions channels;
  ServerCheckpointOptions checkpoints;
  ServerTakeoverOptions takeover;
  bool record_pulls = false;        // keep a PullRecord per answered pull (tests)
  // A Chrome trace-event JSON timeline of this process (common/obs/trace.h), started once the shard
  // has its rank and its clock offset against the scheduler (empty: none). The process writes it
  // when done (Trace::Stop); shards it takes over record into the same one.
  std::string trace_path;
};

// One answered pull, with the clocks the decision was made on.
struct PullRecord {
  int worker = 0;
  int64_t clock = 0;
  int64_t min_live_clock = 0;
  int64_t rounds_applied = 0;
  int64_t version = 0;
  int64_t clock_staleness = 0;  // what the reply said (ConsistencyController::ClockStaleness)
};

// Requests answered and refused (RequestDispatcher, ErrorReplies, PushPullService).
struct RequestStats {
  int64_t pushes = 0;
  int64_t pulls = 0;
  int64_t rejected = 0;    // answered with an ERROR
  int64_t malformed = 0;   // structurally broken (counted by the transport too)
  std::map<int64_t, int64_t> version_lag;      // shard version at apply - push's version -> gradients
  std::map<int64_t, int64_t> clock_staleness;  // ClockStaleness of an answered pull -> pulls
};

// Checkpoints and restores (ServerCheckpoints, ServerLifecycle).
struct RecoveryStats {
  int64_t checkpoints = 0;       // written
  double checkpoint_ms_max = 0;  // the slowest write
  int64_t checkpoint_failures = 0;  // writes failed since the last good one
  double last_checkpoint_s = -1;    // when the last good one was written (NowMs() / 1e3; -1: none)
  bool restored = false;         // started from a checkpoint, a backup's copy, or its own state after a pause
  bool adopted = false;          // a backup that took over a dead server's shard
  int64_t lost_updates = 0;      // restored: pushes the workers had made past the checkpoint
};

// Replication (--replicas; ShardReplication's counts at the end).
struct ReplicationStats {
  int64_t replicated = 0;        // entries sent to backups
  int64_t replica_entries = 0;   // entries received as a backup
};

// The optimizer state and parameters workers read and set (StateService).
struct StateStats {
  int64_t state_pulls = 0;       // STATE_PULLs answered (the optimizer state read by a worker)
  int64_t state_sets = 0;        // optimizer states set by a worker (STATE_PUSH)
  int64_t params_sets = 0;       // parameters set by a worker (STATE_PUSH with params)
};

struct ServerStats {
  RequestStats requests;
  RecoveryStats recovery;
  ChannelCounts channels;        // the value channels' counts at the end (ShardChannels)
  ReplicationStats replication;
  StateStats state;
  TrafficCounters traffic;
};

}  // namespace gradsync
