// Server: one parameter-server shard process (gradsync-server --role=server).
//
// Owns a ROUTER data socket that workers connect to, a SchedulerClient, a ConsistencyController
// and (after worker 0's INIT) a KvShard. One thread runs the request loop: every message is
// validated (structure by the transport; sender, clocks, versions and ranges here) before it
// touches the shard, and a bad one is answered with an ERROR (or dropped when it cannot be
// answered) and counted; it never stops the loop or changes parameters. Pulls that the
// consistency rule cannot answer yet are parked and answered as soon as it can. Dead workers
// (from the scheduler) leave the live set; a worker the scheduler announces as rejoined JOINs and
// goes on at the clock the shard suggests. With a checkpoint directory the shard's state is
// written atomically every K updates or T seconds; a restarted shard that rejoins the job
// restores it, and each worker JOINs with the clock it has reached: the pushes it had made past
// the checkpoint are lost, counted in stats().lost_updates and logged. The loop ends on the
// scheduler's SHUTDOWN, when the scheduler is lost, or on Stop().
//
// Run() and everything but Stop() belong to one thread; read the stats after Run() returns.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/partitioner.h"
#include "common/scheduler_client.h"
#include "common/status.h"
#include "common/transport.h"
#include "compression/compressor.h"
#include "server/consistency.h"
#include "server/kv_shard.h"

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
  // Checkpoints (off when the directory is empty): DIR/shard-<rank>.ckpt, written atomically
  // every `checkpoint_every` updates (0: not by count) or `checkpoint_interval_s` seconds after
  // the first update since the last one, whichever comes first. A restarted shard that rejoins
  // the job restores from it.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  double checkpoint_interval_s = 5.0;
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
  bool restored = false;         // started from a checkpoint
  int64_t lost_updates = 0;      // restored: pushes the workers had made past the checkpoint
  std::map<int64_t, int64_t> version_lag;      // shard version at apply - push's version -> gradients
  std::map<int64_t, int64_t> clock_staleness;  // ClockStaleness of an answered pull -> pulls
  TrafficCounters traffic;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(zmq::context_t& ctx, const ServerOptions& options);

  uint16_t port() const { return socket_.port(); }
  Status Run();
  void Stop() { stop_.store(true); }

  int rank() const { return rank_; }
  const ServerStats& stats() const { return stats_; }
  const std::vector<PullRecord>& pull_log() const { return pull_log_; }
  // The shard's parameters (empty before INIT).
  std::vector<float> params() const;

 private:
  // A bsp push held until its round completes; rounds are summed in worker-rank order so that a
  // bsp run is bit-for-bit reproducible whatever order the pushes arrive in.
  // One message's part of a push: its segments and keys, and its values, kept without a copy
  // where the received frame is float-aligned.
  struct PushChunk {
    std::vector<SegmentRef> segments;
    std::vector<uint64_t> keys;
    zmq::message_t frame;       // the received values, when they are read in place
    std::vector<float> owned;   // or decoded / realigned / small values
    // Read where they are now: a chunk moves (into a round, a vector), and so does a frame.
    const float* values() const {
      return owned.empty() ? static_cast<const float*>(frame.data()) : owned.data();
    }
  };
  // A push: one message, or the parts of an overlapped push (Header.parts > 1).
  struct HeldPush {
    std::vector<PushChunk> chunks;
  };
  // The parts of an overlapped push received so far from one worker. Parts come in order on the
  // worker's connection; the push counts (consistency, version, reply) when its last part
  // arrives. After a bad part the rest of that push is dropped without a reply: the worker gets
  // one answer per push and shard, the error.
  struct PartialPush {
    int64_t clock = 0;
    int64_t version = 0;
    int parts = 0;
    int next = 0;
    bool failed = false;
    HeldPush push;
    std::vector<SegmentRef> covered;  // sorted by offset, disjoint
  };
  // The values of a validated push message as a chunk that outlives the message.
  PushChunk TakeChunk(Message& m, std::vector<SegmentRef> segs, const float* values, size_t n);
  // Receives one part of an overlapped push; the whole push once its last part is in (else null).
  Result<HeldPush*> AddPart(Message& m, std::vector<SegmentRef> segs, const float* values, size_t n);
  void ApplyRound();

  // Reply buffers lent to ZeroMQ and reused once it releases them: a pull reply is one copy
  // (the snapshot) into memory that is already mapped.
  struct ReplyBuffer {
    std::vector<float> data;
    std::vector<uint64_t> keys;
    std::shared_ptr<InflightCounter> inflight = std::make_shared<InflightCounter>();
  };
  ReplyBuffer* AcquireReplyBuffer(size_t n);
  std::vector<std::unique_ptr<ReplyBuffer>> reply_pool_;

  struct Parked {
    Message msg;
    double since = 0;
  };

  Server(zmq::context_t& ctx, ServerOptions options, Socket socket)
      : ctx_(ctx), options_(std::move(options)), socket_(std::move(socket)) {}

  void Handle(Message& m);
  Status CheckSender(const Message& m);
  Status HandleInit(const Message& m);
  // Builds the shard (and the job's codecs) for `job`; INIT and a restore share it.
  Status BuildShard(const wire::JobConfig& job);
  // JOIN: a (re)joining worker asks where to start (clock -1) or says where it goes on.
  Status HandleJoin(const Message& m);
  // Checkpoints: written when due (after an update, or from the loop once the interval passed).
  void MaybeCheckpoint(bool updated);
  Status WriteCheckpoint();
  Status RestoreCheckpoint();
  std::string CheckpointPath() const;
  // An overlapped push comes in at most this many parts (Header.parts).
  static constexpr int kMaxPushParts = 4096;
  Status HandlePush(Message& m);
  Status HandlePushMessage(Message& m);
  Status HandlePull(Message& m);
  // Answers a pull whose segments and keys (validated) are given; AnswerParkedPull reads them
  // from the parked message first.
  void AnswerPull(const Message& m, const std::vector<SegmentRef>& segs, std::span<const uint64_t> keys,
                  double waited_ms);
  void AnswerParkedPull(const Message& m, double waited_ms);
  // --compress-pull: answers with the encoded delta against the worker's mirror; false when
  // the pull must be answered raw (no mirror yet, or it asks for sparse keys).
  bool AnswerCompressedPull(const Message& m, const std::vector<SegmentRef>& segs, double waited_ms);
  // Records what a raw reply gave the worker.
  void UpdateMirror(int worker, const std::vector<SegmentRef>& segs, const float* values);
  void AnswerParked();
  // Counts an answered pull with the clock staleness its reply carried.
  void RecordPull(const wire::Header& h, int64_t clock_staleness);
  void ReplyError(const Message& m, const Status& s);
  // The scheduler's news: dead workers leave the live set; a rejoined worker may JOIN.
  void OnMembership();
  std::vector<SegmentRef> Segments(const Message& m) const;
  wire::Header ReplyHeader(wire::Type type, const wire::Header& request) const;

  zmq::context_t& ctx_;
  ServerOptions options_;
  Socket socket_;
  std::unique_ptr<SchedulerClient> scheduler_;
  std::atomic<bool> stop_{false};
  int rank_ = -1;
  wire::ClusterTable table_;
  std::unique_ptr<ConsistencyController> controller_;
  std::unique_ptr<KvShard> shard_;
  std::map<int, std::string> identity_of_worker_;
  std::deque<Parked> parked_;
  std::map<int, HeldPush> round_;  // worker -> its push of the open round
  std::map<int, PartialPush> partial_;  // worker -> the overlapped push it is sending
  uint64_t seen_events_ = 0;
  size_t seen_dead_ = 0;
  size_t seen_joined_ = 0;
  std::set<int> may_join_;  // workers the scheduler announced as rejoined, not yet JOINed
  wire::JobConfig job_;     // from INIT (or the checkpoint)
  int64_t updates_since_checkpoint_ = 0;
  double last_checkpoint_ = 0;   // seconds (steady clock)
  double first_dirty_ = 0;       // when the first update since the last checkpoint happened
  std::vector<int64_t> restored_pushed_;  // per worker: its clock in the checkpoint
  std::set<int> resynced_;                // restored: workers that JOINed since
  ServerStats stats_;
  std::vector<PullRecord> pull_log_;
  std::string codec_spec_;                 // the job's push codec ("" = raw floats)
  std::unique_ptr<Compressor> codec_;
  // --compress-pull: what each worker holds of this shard (its last pull, raw or decoded), so
  // that a reply carries the compressed delta and the compression error stays on the server
  // (error feedback, one residual per worker: params - mirror).
  struct Mirror {
    std::vector<float> values;  // over the shard's range
    bool valid = false;         // a raw pull of the whole range has set it
  };
  bool staleness_aware_lr_ = false;
  std::unique_ptr<Compressor> pull_codec_;
  std::map<int, Mirror> mirrors_;
  std::vector<float> pull_current_, pull_delta_, pull_decoded_;
  std::vector<uint8_t> pull_payload_;
  std::vector<float> decoded_;
  std::vector<uint64_t> key_buffer_;
};

}  // namespace gradsync
