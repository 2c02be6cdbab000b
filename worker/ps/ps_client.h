// PsClient: a worker's side of the parameter server: push gradients to and pull parameters from
// every shard, in parallel, with request ids and deadlines (ps-lite's Push/Pull + Wait shape,
// but Wait returns a Status and never hangs on a dead shard).
//
// The flat parameter space is cut by the Partitioner; a request goes to every shard at once as
// one message each: the shard's dense runs (as segments) and, for sparse tensors, the keys that
// fall in its range. A dense push lends the caller's gradient buffer to ZeroMQ (no copy): the
// buffer must not change until Wait() on that push has returned. Pull replies are written
// straight into the caller's parameter buffer as they arrive.
//
// Wait() processes replies to any outstanding request while it waits. It fails with the
// server's ERROR, kUnavailable when the scheduler declares a shard dead or restarted (or the
// scheduler is lost), or kDeadlineExceeded. After a shard restarted (from its checkpoint) the
// worker calls Reconnect and Join(shards, clock) and retries its step. Not thread-safe: one
// training thread uses a client.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/wait_policy.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "common/net/control/scheduler_client.h"
#include "common/net/transport.h"
#include "common/ps/partitioner.h"
#include "common/ps/ps_protocol.h"
#include "compression/compressor.h"
#include "compression/gradient_encoder.h"
#include "compression/pull_delta.h"
#include "summary.pb.h"
#include "worker/channels/worker_channels.h"

namespace gradsync {

// The shards' optimizer state, assembled per tensor of the layout (PsClient::PullOptimizerState,
// PushOptimizerState).
struct OptimizerStateParts {
  std::string kind;   // the shards' optimizer: sgd | adam | lars | lamb
  int64_t steps = 0;  // its steps taken (Adam's and LAMB's t; 0: none yet, every vector zeros)
  // Per tensor of the layout, its own steps taken (at most `steps`: the steps it had no gradient
  // in are not its; torch's per-parameter "step"); empty: every tensor's is `steps`.
  std::vector<int64_t> tensor_steps;
  // slots[k][t]: the optimizer's state vector k (OptimizerSlotNames' order: SGD's momentum buffer;
  // Adam's exp_avg, exp_avg_sq) of tensor t of the layout, in layout order, flat (the tensor's size).
  std::vector<std::vector<std::vector<float>>> slots;
};

class PsClient {
 public:
  using RequestId = uint64_t;

  // Connects to every server of `table`. `scheduler` (may be null) reports dead servers; first it
  // tells the scheduler this layout's largest message and waits until every shard accepts it.
  static Result<std::unique_ptr<PsClient>> Create(TransportContext& ctx, const wire::ClusterTable& table,
                                                  int rank, std::vector<TensorInfo> layout,
                                                  SchedulerClient* scheduler);

  // Compresses every push's dense part with `spec` (compression/compressor.h), with one
  // error-feedback residual per shard when error_feedback is set, or DGC momentum correction
  // with factor `correction_momentum` (> 0; sparsifying codecs). Dense models only.
  // With compress_pull (the job must say so too), non-full pulls ask for the compressed delta
  // since this worker's last pull and add it to the target: the target must then be the same
  // buffer on every pull, changed by nothing else.
  Status SetCompression(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum = 0,
                        bool compress_pull = false);

  // Worker 0: sends the job and each shard's initial values; waits for every shard.
  Status Init(const wire::JobConfig& job, ConstFloatSpan params, double timeout_s);

  // Pushes the gradient of iteration `clock`: the dense tensors of `grads` (lent, see above) and
  // the sparse (key, value) pairs (flat keys, sorted, unique). Carries the versions of the last
  // pull, and `lr` (the worker's own rate for this gradient) unless it is NaN. `absent`: dense
  // tensors (layout indices, increasing) that got no gradient: each shard is told which of them
  // it holds, and leaves them alone (their values, zeros, still travel). `only`: to these shards
  // alone (a push resent to shards that lost it), else to every shard.
  Result<RequestId> Push(int64_t clock, ConstFloatSpan grads, std::span<const uint64_t> keys,
                         std::span<const float> values, float lr = NAN, std::span<const uint32_t> absent = {},
                         std::span<const int> only = {});
  // Pulls into `params` (the whole flat buffer): the dense tensors, and the given sparse keys.
  // full = true pulls every element, sparse tensors included (for evaluation).
  Result<RequestId> Pull(int64_t clock, FloatSpan params, std::span<const uint64_t> keys, bool full = false);
  Status Wait(RequestId id, double timeout_s);
  // How Wait, and a channel's wait for room, wait (common/base/wait_policy.h): before Wait sleeps
  // on the sockets, it polls them for up to policy.busy_poll_ms, yielding the core between polls
  // (0: it sleeps at once). A thread that sleeps needs waking when the reply comes, and a waking
  // thread may wait for a core (or, on a virtual machine, for its idle virtual CPU to be
  // scheduled again) much longer than the reply took (bench/README.md).
  void set_wait_policy(const WaitPolicy& policy) { wait_ = policy; }
  // How many times Wait polled the sockets instead of sleeping on them (the polls the wait
  // policy asks for; 0 while its busy_poll_ms is 0), since this client was made.
  int64_t busy_polls() const { return busy_polls_; }

  // Overlap (dense models, raw values; BytePS's recipe). The dense gradient is cut into parts at
  // tensor and shard boundaries, each at most `part_floats` elements (default 1M, 4 MB).
  // BeginPush(clock, grads, lr) opens the push of `clock` (grads lent and lr as for Push);
  // PushReady(t) sends tensor t's parts the moment backward has produced its gradient; FinishPush
  // sends what was never reported ready, its parts of the `absent` tensors (as Push's) marked so,
  // and returns the push's id (one reply per shard, as Push). A
  // shard receives its parts in the order sent, numbered (PsFields.parts/part), and counts the push
  // when the last one arrives: bsp, ssp and asp mean what they mean for Push.
  void set_part_floats(size_t part_floats);
  RequestId BeginPush(int64_t clock, ConstFloatSpan grads, float lr = NAN);
  void PushReady(size_t tensor);
  RequestId FinishPush(std::span<const uint32_t> absent = {});
  // Pulls every dense tensor into `params`, one request per tensor, sent in forward order (the
  // first tensor first, so that shards answer it first): Wait(ids[t]) returns once tensor t is
  // in params. Every returned id must be waited for. Sparse tensors get id 0 (not pulled).
  std::vector<RequestId> PullTensors(int64_t clock, FloatSpan params);
  // Processes the replies that have arrived, without waiting.
  void Poll();
  // Communication in progress: a pull not answered yet, or pushed gradient bytes ZeroMQ still
  // holds (not yet written to the socket). For the overlap measurement.
  bool InFlight() const;

  // The optimizer state the shards hold (ARCHITECTURE.md, "Optimizer state"), read or set at this
  // worker's clock `clock` (its pushes so far, one still in flight included): each shard serves
  // the request where it would answer a pull of that clock (bsp: once round clock - 1 is applied,
  // and before round clock can be, which needs this worker's next push). Each shard's vectors
  // come in one go (one message each), so a shard's state is one state.
  //
  // PullOptimizerState: `kind` is the optimizer the caller expects ("": whatever the shards'); a
  // shard with another refuses (kInvalidArgument). kFailedPrecondition when the shards disagree on
  // their optimizer or its step count (ssp/asp: another worker's push applied on some shards but
  // not yet on others; read where no push is in flight).
  Result<OptimizerStateParts> PullOptimizerState(int64_t clock, double timeout_s, const std::string& kind = "");
  // PushOptimizerState: sets every shard's part of `state`; each shard sets its whole part at once
  // (at its quiescent point, above) and answers once its backups hold it. kInvalidArgument, with
  // nothing sent, when `state` does not fit the layout (an unknown optimizer, steps < 0, more than
  // kMaxOptimizerSlots vectors, a vector without one entry per tensor, an entry whose size is not
  // its tensor's) or holds a value CheckOptimizerSlot refuses; a shard refuses a state that is not
  // its optimizer's (kind, number of vectors), and sets nothing of it (every shard refuses alike).
  Status PushOptimizerState(int64_t clock, const OptimizerStateParts& state, double timeout_s);
  // PushParameters: sets every shard's parameters to its range of `params` (the whole flat
  // buffer), at this worker's clock `clock` as PushOptimizerState sets the state (the optimizer
  // state stays as it is), and returns once every shard (and its backups) holds them: a worker
  // whose copy of the model was changed outside training (a checkpoint loaded on rank 0, then
  // broadcast) makes it the shards'. kInvalidArgument, with nothing sent, when `params` is not the
  // layout's size or holds a value that is not finite; a shard refuses such a set alike.
  Status PushParameters(int64_t clock, ConstFloatSpan params, double timeout_s);

  // Elastic membership and recovery.
  // JOIN on `shards`: clock -1 asks each where to start (a worker that rejoined a running job);
  // clock c >= 0 says this worker goes on at c (after a shard restarted, or to settle on the
  // largest suggestion). Returns the largest clock the shards answered (each shard's:
  // join_clock(s); for a live worker and clock -1, the pushes the shard holds of it). Retries a
  // shard that is not ready yet (kUnavailable) until timeout_s.
  Result<int64_t> Join(const std::vector<int>& shards, int64_t clock, double timeout_s);
  int64_t join_clock(int s) const { return shards_[static_cast<size_t>(s)].join_clock; }
  // Shards whose server died or restarted since their connection was made: their requests
  // fail with kUnavailable, and they need Reconnect once the scheduler has them back.
  std::vector<int> shards_to_reconnect() const;
  // Waits (at most timeout_s) until the scheduler has every shard of shards_to_reconnect() back
  // (NODE_JOINED), connects to their new addresses, and forgets every outstanding request.
  Status Reconnect(double timeout_s);

  // Value channels beside ZeroMQ (worker/channels/, ARCHITECTURE.md, "Value channels"): dense raw
  // pushes and pulls to a shard with a channel move their values there; only headers go over
  // ZeroMQ. Keys and codecs always go over ZeroMQ; a channel that breaks is dropped (a pull read
  // from it is asked again over ZeroMQ) and the next requests go over ZeroMQ. Reconnect attaches
  // again to the shards it reconnects.
  //
  // AttachSharedMemory: a shared-memory lane (common/net/shm_lane.h) to every shard on this host (its
  // address a loopback one or this worker's own). A shard that refuses (another host after all,
  // another user, no room) goes on without. Returns the number of lanes attached.
  Result<int> AttachSharedMemory(double timeout_s);
  int shm_lanes() const { return channels_.count(wire::CHANNEL_LANE); }
  // Value bytes that went through lanes (pushed, pulled); not on any wire.
  uint64_t shm_bytes_pushed() const { return channels_.bytes(wire::CHANNEL_LANE).pushed; }
  uint64_t shm_bytes_pulled() const { return channels_.bytes(wire::CHANNEL_LANE).pulled; }

  // AttachDataChannels: a data channel (common/net/data_channel.h) to every shard without a lane, for
  // requests of at least data_min_floats() values, received straight into the destination. Not
  // with CURVE (--auth-dir: values stay encrypted on ZeroMQ), nor with a codec. Returns the number
  // of channels.
  Result<int> AttachDataChannels(double timeout_s);
  int data_channels() const { return channels_.count(wire::CHANNEL_DATA); }
  void set_data_min_floats(size_t n) { channels_.set_data_min_floats(n); }
  size_t data_min_floats() const { return channels_.data_min_floats(); }
  // Value bytes that went over data channels (pushed, pulled); counted in traffic() too.
  uint64_t data_bytes_pushed() const { return channels_.bytes(wire::CHANNEL_DATA).pushed; }
  uint64_t data_bytes_pulled() const { return channels_.bytes(wire::CHANNEL_DATA).pulled; }

  // Over the shards (max): the version lag the last push was applied with (-1 until known), the
  // clock staleness of the last answered pull (-1 until known), how long the last pull was held by
  // the consistency rule.
  double last_version_lag() const;
  int64_t last_clock_staleness() const;
  double last_wait_ms() const;
  // Every reply so far, counted as the shards count them in their summaries: pushes
  // acknowledged and pulls answered (one per shard each), the version lag of each acknowledged
  // push and the clock staleness of each answered pull.
  struct ReplyCounts {
    int64_t pushes = 0;
    int64_t pulls = 0;
    std::map<int64_t, int64_t> version_lag;
    std::map<int64_t, int64_t> clock_staleness;
  };
  const ReplyCounts& reply_counts() const { return counts_; }
  TrafficCounters traffic() const;
  const Partitioner& partitioner() const { return partitioner_; }

 private:
  // A STATE_PULL's replies, per shard, as they come.
  struct StateGather {
    struct Shard {
      std::string kind;
      int64_t steps = 0;
      std::vector<int64_t> skipped;  // per layer of its range
      int slots = 0;
      int received = 0;  // vectors so far
      std::vector<float> values;  // slots * the range's size
    };
    std::vector<Shard> shards;
  };
  struct Pending {
    int remaining = 0;
    Status status;
    bool is_pull = false;
    FloatSpan target;
    std::vector<int> waiting;  // shards not answered yet (one entry per message due)
    double sent_us = -1;  // traces: when it was sent (a pull's span ends with its reply)
    std::shared_ptr<StateGather> state;  // a STATE_PULL
    std::shared_ptr<PsReply> answer;     // a CHANNEL_ATTACH: its reply
  };
  // One shard: what this client keeps of it and what its replies said.
  struct Shard {
    std::shared_ptr<InflightCounter> lent;  // gradient frames ZeroMQ still holds
    bool broken = false;                    // dead or restarted: needs Reconnect
    int64_t join_clock = -1;                // the last JOIN_REPLY's clock
    std::vector<Segment> dense_runs;        // the layout's dense runs in its range
    int64_t dense_floats = 0;               // their size (a step's whole request)
    std::unique_ptr<GradientEncoder> encoder;  // --compress
    int64_t version = 0;                    // of the last pull reply
    double version_lag = -1;
    double wait_ms = 0;
    int64_t clock_staleness = -1;
  };
  // The job's codec (--compress): its spec, the encoded buffer and, with --compress-pull, the
  // decoder of the shards' deltas. Empty spec: raw values.
  struct Codec {
    std::string spec;
    std::vector<uint8_t> encoded;
    std::unique_ptr<PullDeltaDecoder> pull_decoder;
  };
  // Buffers reused across requests.
  struct Scratch {
    std::vector<float> values;
    std::vector<uint64_t> keys;
    std::vector<float> key_values;
  };
  // The dense parts of an overlapped push or a step's per-tensor pulls (set_part_floats), in
  // offset order, and which belong to each tensor.
  struct Part {
    size_t tensor = 0;
    int shard = 0;
    int64_t begin = 0, end = 0;
  };
  struct PartPlan {
    size_t part_floats = size_t{1} << 20;
    std::vector<Part> parts;  // empty until planned
    std::vector<std::vector<size_t>> of_tensor;
    std::vector<int> per_shard;
  };
  // The open overlapped push.
  struct OpenPush {
    RequestId id = 0;
    int64_t clock = 0;
    float lr = NAN;  // on every part
    ConstFloatSpan grads;
    std::vector<int64_t> versions;  // of the last pull, the same on every part
    std::vector<bool> sent;         // per part
    std::vector<int> next;          // per shard: the next part number
    std::vector<int> way;           // per shard: kUndecided, kZmq or kChannel (decided by its first part)
  };
  static constexpr int kUndecided = 0, kZmq = 1, kChannel = 2;
  // The scheduler's news seen so far (CheckMembership).
  struct NewsSeen {
    uint64_t events = 0;
    size_t joined = 0;
  };

  PsClient(TransportContext& ctx, const wire::ClusterTable& table, int rank, std::vector<TensorInfo> layout,
           SchedulerClient* scheduler);
  RequestId NewRequest(bool is_pull, FloatSpan target, int parts);
  // A request of this worker's: its type, id and clock.
  PsRequest Request(wire::Type type, RequestId id, int64_t clock) const;
  // Sends request r (its id's, waited for: the shard is added to its waiting list) to shard s; a
  // failed send fails the shard's part of it with `what` as context.
  void Send(int s, const PsRequest& r, const Payload& p, const char* what);
  // Request r to shard s alone, and its reply (CHANNEL_ATTACH; WorkerChannels::Ask).
  Result<PsReply> Ask(int s, PsRequest r, double timeout_s);
  // Push's part for shard s: the channel, or the ZeroMQ payload (lent, copied or encoded).
  // An error: the codec failed (nothing sent to s).
  Status PushTo(int s, RequestId id, PsRequest& r, ConstFloatSpan grads, std::span<const uint64_t> keys,
                std::span<const float> values);
  Status EncodePush(int s, std::span<const Segment> runs, ConstFloatSpan grads, int64_t clock, Frame* frame);
  // The pull of `segments` to shard s through its channel, if one takes it: names it in r.at.
  void PullThrough(int s, RequestId id, PsRequest& r, int64_t whole);
  // Whether shard s may take a value channel now (raw values, not dead).
  bool RawTo(int s) const;
  // What a channel runs while it waits for shard s (WorkerChannel::Progress).
  Status Progress(int s);
  // Fails the requests of shards whose server the scheduler declared dead or saw restart.
  void CheckMembership();
  // Until ZeroMQ has released every lent gradient frame, except a dead shard's.
  void WaitForLentFrames();
  // Handles the replies that arrive within timeout_ms; returns early once request `until` (if
  // not 0) is answered or failed.
  Status Receive(int timeout_ms, RequestId until = 0);
  void HandleReply(int shard, const Message& m);
  // HandleReply's work on the request (`decoded`: m's header, decoded once); sets *frame_read
  // once it has read the reply's frame from its channel.
  void ApplyReply(int shard, const Message& m, const Result<PsReply>& decoded, bool* frame_read);
  // The request a reply of `shard` answers, its message counted (more: a piece, the rest to
  // come); null for a late reply to a failed request, or a duplicate.
  Pending* Answered(int shard, RequestId id, bool more);
  // A PULL_REPLY's values into p.target: true once taken, false when its channel broke and the
  // pull was asked again over ZeroMQ; an error for values that do not fit.
  Result<bool> TakePull(int shard, const Message& m, const PsReply& r, Pending& p, bool* frame_read);
  Status TakeZmqPull(int shard, const Message& m, const PsReply& r, Pending& p);
  // A pull's reply handled: its counts and trace.
  void NotePull(int shard, const Message& m, const PsReply& r, const Pending& p, bool more);
  // A STATE_PULL_REPLY of `shard` into p.state; an error for one that is not the vector due.
  Status TakeStateReply(int shard, const Message& m, const PsReply& r, Pending& p);
  void PlanParts();
  void SendPart(size_t part, bool absent = false);
  void FailShard(int shard, const Status& s);
  std::string Name(int s) const;

  TransportContext& ctx_;
  wire::ClusterTable table_;
  int rank_;
  std::vector<TensorInfo> layout_;
  Partitioner partitioner_;
  SchedulerClient* scheduler_;
  NewsSeen seen_;
  std::vector<Shard> shards_;
  std::vector<Socket> sockets_;  // per shard, its connection
  TrafficCounters retired_traffic_;  // of the connections Reconnect replaced
  int64_t max_message_bytes_ = kMaxControlMessageBytes;  // both ways (MaxShardMessageBytes)
  WaitPolicy wait_{};  // set_wait_policy
  int64_t busy_polls_ = 0;  // busy_polls(): Wait's thread alone counts
  RequestId next_id_ = 1;
  std::map<RequestId, Pending> pending_;
  ReplyCounts counts_;
  Codec codec_;
  Scratch scratch_;
  PartPlan plan_;
  OpenPush open_;
  WorkerChannels channels_;
};

// A worker's summary (OUT/worker-<rank>.json) of its replies: pushes, pulls and the two
// histograms, in the shards' units.
void SetReplyCounts(const PsClient::ReplyCounts& counts, summary::ProcessSummary* s);

}  // namespace gradsync
