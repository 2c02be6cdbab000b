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
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/partitioner.h"
#include "common/ps_protocol.h"
#include "common/scheduler_client.h"
#include "common/shm_lane.h"
#include "common/status.h"
#include "common/transport.h"
#include "compression/compressor.h"
#include "compression/pull_delta.h"
#include "common/consistency.h"
#include "server/data_lanes.h"
#include "server/kv_shard.h"
#include "server/push_assembler.h"
#include "server/replication.h"
#include "server/shard/shard_core.h"
#include "server/shard_checkpointer.h"

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
  std::shared_ptr<class Colocated> colocated;
  // A Chrome trace-event JSON timeline of this process (common/trace.h), started once the shard
  // has its rank and its clock offset against the scheduler (empty: none). The process writes it
  // when done (Trace::Stop); shards it takes over record into the same one.
  std::string trace_path;
};

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

 private:
  struct Parked {
    Message msg;
    PsRequest pull;
    double since = 0;
  };

  Server(TransportContext& ctx, ServerOptions options, Socket socket)
      : ctx_(ctx),
        options_(std::move(options)),
        socket_(std::move(socket)),
        checkpointer_(options_.checkpoint_dir, options_.checkpoint_every, options_.checkpoint_interval_s) {}

  // Dispatch: every message is decoded (common/ps_protocol.h) and its sender checked first.
  void Handle(Message& m);
  Status CheckSender(const PsRequest& r, const std::string& peer);
  Status HandleInit(const PsRequest& r, const Message& m);
  // Builds the shard (and the job's codecs) for `job`; INIT and a restore share it.
  // (from: a checkpoint or a backup's copy to restore, else a fresh shard from INIT's values.)
  Status BuildShard(const wire::JobConfig& job, const wire::ShardCheckpoint* from = nullptr);
  bool built() const { return core_ && core_->built(); }
  // JOIN: a (re)joining worker asks where to start (clock -1) or says where it goes on.
  Status HandleJoin(const PsRequest& r, const Message& m);
  Status HandlePush(const PsRequest& r, Message& m);
  // `lane`: a shared-memory push's lease on its lane (LaneLease), held with its values.
  Status HandlePushMessage(const PsRequest& r, Message& m, std::shared_ptr<const float> lane);
  // Shared-memory lanes (common/shm_lane.h): a worker on this host attaches one; its pushes' values
  // are then read from it and its pulls answered into it, in pieces (AnswerPullShm).
  Status HandleAttach(const PsRequest& r, const Message& m);
  // The values of a shm push (contiguous segments in range) in the worker's lane.
  Result<const float*> LaneValues(const PsRequest& r, const Message& m, size_t n);
  // A shared-memory push's hold on worker w's lane: when the last copy goes, the shard is done
  // reading it and the worker may write its push area again (null: not a lane push, or no lane).
  std::shared_ptr<const float> LaneLease(const PsRequest& r);
  // Worker w's lane goes (dead, or a new one replaces it); a push of it still held keeps it mapped.
  void DetachLane(int w);
  void AnswerPullShm(const PsRequest& r, const Message& m, PsReply reply);
  // What a push through a lane or the data channel must be: dense raw values over contiguous
  // segments in the range (n: their count).
  Status CheckLanePush(const PsRequest& r, const Message& m, size_t* n, const char* what);
  // The data channel (common/data_channel.h): DATA_ATTACH hands this shard a token; the worker's
  // connection presenting it then carries the values of its dense pushes and pulls.
  Status HandleDataAttach(const PsRequest& r, const Message& m);
  // A data-channel push's values: its frame, leased until the push is done with.
  Result<std::shared_ptr<const float>> DataValues(const PsRequest& r, const Message& m, size_t n);
  int64_t data_pushes_ = 0;  // pushes taken from data channels (tests)
  // Answers a pull over worker r.worker's data channel; false when it has none (answer over ZeroMQ).
  bool AnswerPullData(const PsRequest& r, const Message& m, PsReply& reply);
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
  Status CheckStateRequest(const PsRequest& r, const Message& m);
  Status HandleStatePull(PsRequest r, Message& m);
  // The whole state, one STATE_PULL_REPLY per state vector, sent before anything else is handled.
  void AnswerStatePull(const PsRequest& r, const Message& m);
  // A STATE_PUSH: its vectors are gathered (each checked on arrival; a bad one drops the set) and
  // the state is set at once when the last has come and the worker's clock allows it.
  Status HandleStatePush(const PsRequest& r, const Message& m);
  // Sets worker w's gathered state, sends it to the backups (the reply waits for them) and replies.
  void ApplyStateSet(int w);
  // The shard's optimizer state to the backups as REPLICA_OPTIMIZER entries; the last's sequence number.
  uint64_t ReplicateOptimizerState(int worker);
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
  // Replication. An entry carrying the consistency state after it.
  wire::Header Entry(wire::ReplicaOp op) const;
  void Replicate(wire::ReplicaOp op, int worker = -1);
  // A push's chunks to the backups; the sequence number of the last.
  uint64_t ReplicatePush(int worker, const HeldPush& push, float scale);
  // One chunk of a push as an entry (its values in *p, read in place).
  wire::Header PushEntry(int worker, const PushChunk& c, bool last, float lr, float scale, Payload* p) const;
  void SendSnapshots();
  // The backups this shard has now (ranks after this one, live, not in this process).
  void UpdateBackups();
  void HandleReplicate(const Message& m);
  TestAckDelay ack_delay_;  // a test's delay of the acknowledgements sent as a backup
  // A dead server whose shard this one holds a whole copy of, and whose first live backup this
  // is: a new Server in this process takes its rank, from the copy.
  void MaybeAdopt(int dead_server);
  Status RestoreFromCopy();
  // Declared dead (paused past the heartbeat timeout): registers again and, given its rank
  // back, serves its shard as it is; workers go on from there.
  Status Rejoin();
  Status Register();
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
  std::unique_ptr<ShardCore> core_;  // the shard, its consistency rule and its open round (made once registered)
  std::unique_ptr<ParallelFor> apply_pool_;  // options_.apply_threads > 1
  // Membership.
  std::map<int, std::string> identity_of_worker_;
  std::set<int> may_join_;  // workers the scheduler announced as rejoined, not yet JOINed
  uint64_t seen_events_ = 0;
  int64_t listening_ = -1;  // the limit last announced with LISTENING
  size_t seen_dead_ = 0;
  size_t seen_joined_ = 0;
  size_t seen_ended_ = 0;
  // Pushes and pulls.
  PushAssembler assembler_;
  std::deque<Parked> parked_;  // pulls and STATE_PULLs the consistency rule holds
  // Per worker: an optimizer state it is setting (STATE_PUSH), its vectors as they come; complete
  // once the last has, then set as soon as the consistency rule lets a pull of its clock through.
  struct StateSet {
    std::string peer;
    PsRequest first;  // its first message: every later one carries the same id, clock, optimizer, steps
    std::vector<float> state;
    int next = 0;  // the vector due next
    bool complete = false;
  };
  std::map<int, StateSet> state_sets_;
  std::map<int, std::shared_ptr<ShmLane>> lanes_;  // worker -> its shared-memory lane
  std::unique_ptr<DataListener> data_;  // made at the first DATA_ATTACH
  std::string codec_spec_;  // the job's push codec ("" = raw floats)
  std::unique_ptr<Compressor> codec_;
  bool staleness_aware_lr_ = false;
  std::unique_ptr<PullDeltaEncoder> pull_encoder_;  // --compress-pull
  LentBufferPool reply_pool_;
  std::vector<float> decoded_, pull_current_;
  std::vector<uint8_t> pull_payload_;
  std::vector<uint64_t> key_buffer_;
  // Checkpoints and recovery.
  ShardCheckpointer checkpointer_;
  std::vector<int64_t> restored_pushed_;  // per worker: its clock in the checkpoint
  std::set<int> resynced_;                // restored: workers that JOINed since
  // Replication.
  std::unique_ptr<Replicator> replicator_;  // this shard's backups (--replicas > 1)
  std::unique_ptr<ReplicaStore> replicas_;  // the copies held here of other shards
  std::shared_ptr<Colocated> colocated_;
  bool standby_ = false;  // came back after a backup took its shard over: copies only (NodeInfo.standby)
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
