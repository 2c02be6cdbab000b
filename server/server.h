// Server: one parameter-server shard process (gradsync-server --role=server).
//
// Owns a ROUTER data socket that workers connect to, a SchedulerClient, a ConsistencyController
// and (after worker 0's INIT) a KvShard. One thread runs the request loop: every message is
// validated (structure by the transport; sender, clocks, versions and ranges here) before it
// touches the shard, and a bad one is answered with an ERROR (or dropped when it cannot be
// answered) and counted; it never stops the loop or changes parameters. Pulls that the
// consistency rule cannot answer yet are parked and answered as soon as it can. Dead workers
// (from the scheduler) leave the live set; a worker the scheduler announces as rejoined JOINs and
// goes on at the clock the shard suggests. A worker that ended training (TRAINING_ENDED) stays
// live, and a pull that needs a push it will never make is answered at once with an error naming
// it (kFailedPrecondition); one that joined leaves the live set as a dead worker does, but its
// pulls are still answered. With a checkpoint directory the shard's state is
// written atomically every K updates or T seconds; a restarted shard that rejoins the job
// restores it, and each worker JOINs with the clock it has reached: the pushes it had made past
// the checkpoint are lost, counted in stats().lost_updates and logged. The loop ends on the
// scheduler's SHUTDOWN, when the scheduler is lost, or on Stop(). The data socket accepts control
// messages only until a worker has told the scheduler the job's largest message (from its model's
// layout); then it is bound again with that limit, before any worker connects.
//
// Run() and everything but Stop() belong to one thread; read the stats after Run() returns.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/scheduler_client.h"
#include "common/net/transport.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"
#include "server/membership.h"
#include "server/parked_requests.h"
#include "server/replication/replication.h"
#include "server/replication/shard_replication.h"
#include "server/shard/delay_compensation.h"
#include "server/shard/push_assembler.h"
#include "server/shard/shard_checkpointer.h"
#include "server/shard/shard_core.h"
#include "server/shard/state_sets.h"
#include "server/shard_codecs.h"
#include "server/channels/shard_channels.h"

namespace gradsync {

struct ServerOptions {
  std::string scheduler_endpoint;   // tcp://host:port
  std::string bind_host = "127.0.0.1";
  std::string advertise_host = "127.0.0.1";
  uint16_t port = 0;
  int requested_rank = -1;
  ConsistencyMode mode = ConsistencyMode::kBsp;
  int staleness = 0;
  double heartbeat_interval_s = 1.0;
  double scheduler_timeout_s = 10.0;
  double register_timeout_s = 120.0;
  bool record_pulls = false;        // keep a PullRecord per answered pull (tests)
  // Tests: once this many pulls went over data channels, the channel of the worker of the last
  // one is dropped with that pull's frame queued, not sent (0: never).
  int64_t drop_data_channel_after_pulls = 0;
  // Tests: once this many pushes came over data channels, the channel of the worker of the last
  // one is dropped, as a frame that ends it would (0: never).
  int64_t drop_data_channel_after_pushes = 0;
  // Threads that apply a large dense update together (the loop's own included; 1: it alone).
  int apply_threads = 2;
  // A data-channel push: how long its frame's last bytes may take after its header came (the
  // worker sends the frame first). The shard's loop waits that long at most, then refuses it.
  double data_wait_s = 10.0;
  // Checkpoints (off when the directory is empty): DIR/shard-<rank>.ckpt, written atomically
  // every `checkpoint_every` updates (0: not by count) or `checkpoint_interval_s` seconds after
  // the first update since the last one, whichever comes first. A restarted shard that rejoins
  // the job restores from it.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  double checkpoint_interval_s = 5.0;
  // A backup taking over a dead shard (--replicas): the copy it starts from, and the ranks this
  // process serves (shared by every Server of the process; never each other's backups).
  std::shared_ptr<ReplicaCopy> restore_from;
  std::shared_ptr<Colocated> colocated;
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

struct ServerStats {
  int64_t pushes = 0;
  int64_t pulls = 0;
  int64_t compressed_pulls = 0;  // answered with a compressed delta (--compress-pull)
  int64_t rejected = 0;    // answered with an ERROR
  int64_t malformed = 0;   // structurally broken (counted by the transport too)
  int64_t checkpoints = 0;       // written
  double checkpoint_ms_max = 0;  // the slowest write
  int64_t checkpoint_failures = 0;  // writes failed since the last good one
  double last_checkpoint_s = -1;    // when the last good one was written (NowMs() / 1e3; -1: none)
  bool restored = false;         // started from a checkpoint, a backup's copy, or its own state after a pause
  bool adopted = false;          // a backup that took over a dead server's shard
  int64_t replicated = 0;        // entries sent to backups
  int64_t replica_entries = 0;   // entries received as a backup
  int64_t lost_updates = 0;      // restored: pushes the workers had made past the checkpoint
  int64_t shm_lanes = 0;         // shared-memory lanes attached now
  int64_t shm_pulls = 0;         // pulls answered through a lane
  int64_t data_channels = 0;     // workers' data channels connected now
  int64_t data_pulls = 0;        // pulls answered over a data channel
  int64_t state_pulls = 0;       // STATE_PULLs answered (the optimizer state read by a worker)
  int64_t state_sets = 0;        // optimizer states set by a worker (STATE_PUSH)
  int64_t params_sets = 0;       // parameters set by a worker (STATE_PUSH with params)
  std::map<int64_t, int64_t> version_lag;      // shard version at apply - push's version -> gradients
  std::map<int64_t, int64_t> clock_staleness;  // ClockStaleness of an answered pull -> pulls
  TrafficCounters traffic;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(TransportContext& ctx, const ServerOptions& options);

  uint16_t port() const { return socket_.port(); }
  Status Run();
  void Stop() { stop_.store(true); }

  int rank() const { return rank_; }
  const ServerStats& stats() const { return stats_; }
  // Seconds since the last good checkpoint was written; -1 when none was (or no --checkpoint-dir).
  double checkpoint_age_s() const;
  // Shards of dead servers this one took over from its copies (each ran its own loop; they have
  // ended when Run returns).
  std::vector<const Server*> adopted() const;
  const std::vector<PullRecord>& pull_log() const { return pull_log_; }
  // The shard's parameters (empty before INIT).
  std::vector<float> params() const;
  // The shard's version: the gradients applied to it since INIT (0 before INIT).
  int64_t version() const;
  // Delay compensation (the job's, ssp/asp), or null: its memory and its counts.
  const DelayCompensation* delay_compensation() const { return built() ? AsDelayCompensation(core_->transform()) : nullptr; }

 private:
  Server(TransportContext& ctx, ServerOptions options, Socket socket)
      : ctx_(ctx),
        options_(std::move(options)),
        socket_(std::move(socket)),
        checkpointer_(options_.checkpoint_dir, options_.checkpoint_every, options_.checkpoint_interval_s) {}

  // Dispatch: every message is decoded (common/ps/ps_protocol.h) and its sender checked first.
  void Handle(Message& m);
  Status HandleInit(const PsRequest& r, const Message& m);
  // Builds the shard (and the job's codecs) for `job`; INIT and a restore share it.
  // (from: a checkpoint or a backup's copy to restore, else a fresh shard from INIT's values.)
  Status BuildShard(const wire::JobConfig& job, const wire::ShardCheckpoint* from = nullptr);
  bool built() const { return core_ && core_->built(); }
  // JOIN: a (re)joining worker asks where to start (clock -1) or says where it goes on.
  Status HandleJoin(const PsRequest& r, const Message& m);
  Status HandlePush(const PsRequest& r, Message& m);
  Status HandlePushMessage(const PsRequest& r, Message& m, ShardChannel& channel);
  // A push message's values, from the channel it names (values/shard_channels.h), checked
  // against the shard's range and decoded: one chunk of the push.
  Result<PushChunk> ReadPush(const PsRequest& r, Message& m, ShardChannel& channel);
  // CHANNEL_ATTACH: the worker's values go through a lane or a data channel from now on.
  Status HandleAttach(const PsRequest& r, const Message& m);
  // A dead worker's rooms in the channels and its half-sent push go.
  void DetachWorker(int w);
  // A bsp round is complete: the core applies it (ShardCore::ApplyRound), the backups hear of it.
  void ApplyRound();
  Status HandlePull(PsRequest r, Message& m);
  // Answers a validated pull (its keys given), raw or (--compress-pull) as a compressed delta.
  void AnswerPull(const PsRequest& r, const Message& m, std::span<const uint64_t> keys, double waited_ms);
  void AnswerParked();
  // Counts an answered pull with the clock staleness its reply carried.
  void RecordPull(const PsRequest& r, int64_t clock_staleness);
  void ReplyError(const Message& m, const Status& s);
  void ReplyError(const std::string& peer, uint64_t request_id, int64_t clock, const Status& s);
  // The optimizer state (ARCHITECTURE.md, "Optimizer state"). Both requests carry the worker's
  // current clock and are served where a pull of that clock would be answered (held until then):
  // in an aggregating mode exactly between rounds clock - 1 and clock. What both must be: this
  // shard initialized, its optimizer (when named), its range, the worker's current clock.
  Status CheckStateRequest(const PsRequest& r);
  Status HandleStatePull(PsRequest r, Message& m);
  // The whole state, one STATE_PULL_REPLY per state vector, sent before anything else is handled.
  void AnswerStatePull(const PsRequest& r, const Message& m);
  // A STATE_PUSH: its vectors are gathered (each checked on arrival; a bad one drops the set) and
  // the state is set at once when the last has come and the worker's clock allows it.
  Status HandleStatePush(const PsRequest& r, const Message& m);
  // Sets a worker's gathered state, sends it to the backups (the reply waits for them) and replies.
  void ApplyStateSet(StateSets::Set set);
  // The scheduler's news: dead workers leave the live set; a rejoined worker may JOIN; a worker
  // that ended training is recorded (ConsistencyController::EndAt: pulls that need its pushes
  // fail at once), and one that joined leaves the rule.
  void OnMembership();
  // Checkpoints: written when due (after an update, or from the loop once the interval passed).
  void MaybeCheckpoint(bool updated);
  void WriteCheckpoint(double now_s);
  // A shard built from a checkpoint's job and put back in its state (a file's or a backup's copy).
  Status RestoreState(const wire::ShardCheckpoint& c);
  Status RestoreCheckpoint();
  // A dead server whose shard this one holds a whole copy of, and whose first live backup this
  // is: a new Server in this process takes its rank, from the copy.
  void MaybeAdopt(int dead_server);
  Status RestoreFromCopy();
  // Declared dead (paused past the heartbeat timeout): registers again and, given its rank
  // back, serves its shard as it is; workers go on from there.
  Status Rejoin();
  Status Register();
  // Run's parts: registered, restored if it rejoined, listening; one pass over what came in;
  // the scheduler's news (a value: the loop ends with it); the summary's last counts.
  Status Start();
  void Receive();
  std::optional<Status> OnSchedulerNews();
  void Finish();
  ShardIdentity Identity() const { return IdentityOf(rank_, table_); }
  // A standby: a server that came back after a backup took its shard over (copies only).
  bool standby() const { return rank_ >= table_.servers_size(); }
  // The job's message limit (the scheduler's table, once a worker has said): raised on the data
  // socket, then the scheduler hears that this shard accepts it (LISTENING), and only then lets
  // workers connect (or announces this restarted shard).
  Status ApplyMessageLimit();

  TransportContext& ctx_;
  ServerOptions options_;
  Socket socket_;
  std::unique_ptr<SchedulerClient> scheduler_;
  std::atomic<bool> stop_{false};
  int rank_ = -1;
  wire::ClusterTable table_;
  ParkedRequests parked_;  // pulls the rule holds back, with their messages
  std::unique_ptr<ShardCore> core_;  // the shard, its consistency rule and its open round (made once registered)
  Membership membership_;  // who speaks for each worker, what a restore held, the scheduler's news
  int64_t listening_ = -1;  // the limit last announced with LISTENING
  // Pushes and pulls.
  ShardCodecs codecs_;  // the job's push codec and --compress-pull's encoder
  std::unique_ptr<ShardChannels> channels_;  // ZeroMQ, shared-memory lanes, data channels (made once registered)
  std::vector<uint64_t> key_buffer_;
  // Checkpoints and recovery.
  ShardCheckpointer checkpointer_;
  // Replication (--replicas > 1): this shard's backups, and the copies held here of others.
  std::unique_ptr<ShardReplication> replication_;
  std::shared_ptr<Colocated> colocated_;
  struct Adoption {
    std::unique_ptr<Server> server;
    std::thread thread;
    Status result;
  };
  std::vector<std::unique_ptr<Adoption>> adopted_;
  ServerStats stats_;
  std::vector<PullRecord> pull_log_;
};

}  // namespace gradsync
