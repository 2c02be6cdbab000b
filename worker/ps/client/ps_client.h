// PsClient: a worker's side of the parameter server: push gradients to and pull parameters from
// every shard, in parallel, with request ids and deadlines (ps-lite's KVWorker shape: Push/Pull +
// Wait over pluggable value channels, but Wait returns a Status and never hangs on a dead shard).
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
//
// The client is this face over its parts, each with its own state: ShardLinks (the connections
// and what the scheduler and the replies said of each shard), PsRequests (ids, pending requests,
// Wait; PsReplies: what each reply does, and their counts), WorkerChannels (how a request's
// values travel: ZeroMQ's own frames, a shared-memory lane or a data channel), PsCodec
// (--compress), PartPlan (overlapped pushes in parts, per-tensor pulls: parts()) and
// StateTransfer (the shards' optimizer state and parameters: state()). A step's embedding-table
// rows (TablePlan: its ids cut per shard) ride with its push and pull.
#pragma once

#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/base/wait_policy.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "common/ps/partitioner.h"
#include "common/ps/ps_protocol.h"
#include "worker/channels/worker_channels.h"
#include "worker/ps/client/part_plan.h"
#include "worker/ps/client/ps_codec.h"
#include "worker/ps/client/ps_replies.h"
#include "worker/ps/client/ps_requests.h"
#include "worker/ps/client/shard_links.h"
#include "worker/ps/client/state_transfer.h"
#include "worker/ps/table_plan.h"

namespace gradsync {

class PsClient {
 public:
  using RequestId = PsRequests::RequestId;
  using ReplyCounts = gradsync::ReplyCounts;

  // Connects to every server of `table`. `scheduler` (may be null) reports dead servers; first it
  // tells the scheduler this layout's largest message and waits until every shard accepts it.
  // `row_message_bytes`: the largest message of table rows a step of this worker sends or
  // receives (0: no tables), accepted alike.
  static Result<std::unique_ptr<PsClient>> Create(TransportContext& ctx, const wire::ClusterTable& table,
                                                  int rank, std::vector<TensorInfo> layout,
                                                  SchedulerClient* scheduler, int64_t row_message_bytes = 0);

  // Compresses every push's dense part with `spec` (compression/compressor.h), with one
  // error-feedback residual per shard when error_feedback is set, or DGC momentum correction
  // with factor `correction_momentum` (> 0; sparsifying codecs). Dense models only.
  // With compress_pull (the job must say so too), non-full pulls ask for the compressed delta
  // since this worker's last pull and add it to the target: the target must then be the same
  // buffer on every pull, changed by nothing else.
  Status SetCompression(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum = 0,
                        bool compress_pull = false);

  int num_shards() const { return links_.size(); }
  // Worker 0: sends the job and each shard's initial values; waits for every shard.
  Status Init(const wire::JobConfig& job, ConstFloatSpan params, double timeout_s);

  // Pushes the gradient of iteration `clock`: the dense tensors of `grads` (lent, see above) and
  // the sparse (key, value) pairs (flat keys, sorted, unique). Carries the versions of the last
  // pull, and `lr` (the worker's own rate for this gradient) unless it is NaN. `absent`: dense
  // tensors (layout indices, increasing) that got no gradient: each shard is told which of them
  // it holds, and leaves them alone (their values, zeros, still travel). `only`: to these shards
  // alone (a push resent to shards that lost it), else to every shard. `rows`: the step's table
  // row gradients (summed per id), each shard's as the last part of its push (the push is then in
  // two parts to that shard: neither a codec nor sparse keys may come with rows).
  Result<RequestId> Push(int64_t clock, ConstFloatSpan grads, std::span<const uint64_t> keys,
                         std::span<const float> values, float lr = NAN, std::span<const uint32_t> absent = {},
                         std::span<const int> only = {}, StepRows rows = {});
  // Pulls into `params` (the whole flat buffer): the dense tensors, and the given sparse keys.
  // full = true pulls every element, sparse tensors included (for evaluation). `rows`: the step's
  // table rows too, into rows.rows, one more message to each shard that holds some (the same
  // request: Wait waits for them all). An empty `params`: the rows alone (no dense message; no
  // message at all when the plan names no row, and Wait returns at once).
  Result<RequestId> Pull(int64_t clock, FloatSpan params, std::span<const uint64_t> keys, bool full = false,
                         StepRows rows = {});
  Status Wait(RequestId id, double timeout_s) { return requests_.Wait(id, timeout_s); }
  // Processes the replies that have arrived, without waiting.
  void Poll() { requests_.Poll(); }
  // Communication in progress: a pull not answered yet, or pushed gradient bytes ZeroMQ still
  // holds (not yet written to the socket). For the overlap measurement.
  bool InFlight() const { return requests_.InFlight(); }
  // How Wait waits, and how often it polled (PsRequests::set_wait_policy, busy_polls).
  void set_wait_policy(const WaitPolicy& policy) { requests_.set_wait_policy(policy); }
  int64_t busy_polls() const { return requests_.busy_polls(); }

  // Overlap (PartPlan): BeginPush / PushReady / FinishPush, PullTensors, set_part_floats.
  PartPlan& parts() { return parts_; }
  // The shards' optimizer state and parameters, read and set (StateTransfer).
  StateTransfer& state() { return state_; }

  // Elastic membership and recovery.
  // JOIN on `shards`: clock -1 asks each where to start (a worker that rejoined a running job);
  // clock c >= 0 says this worker goes on at c (after a shard restarted, or to settle on the
  // largest suggestion). Returns the largest clock the shards answered (each shard's:
  // join_clock(s); for a live worker and clock -1, the pushes the shard holds of it). Retries a
  // shard that is not ready yet (kUnavailable) until timeout_s.
  Result<int64_t> Join(const std::vector<int>& shards, int64_t clock, double timeout_s);
  int64_t join_clock(int s) const { return links_.join_clock(s); }
  // Shards whose server died or restarted since their connection was made: their requests
  // fail with kUnavailable, and they need Reconnect once the scheduler has them back.
  std::vector<int> shards_to_reconnect() const { return links_.shards_to_reconnect(); }
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
  // AttachDataChannels: a data channel (common/net/data_channel.h) to every shard without a lane, for
  // requests of at least channels().data_min_floats() values, received straight into the
  // destination. Not with CURVE (--auth-dir: values stay encrypted on ZeroMQ), nor with a codec.
  // Returns the number of channels.
  Result<int> AttachDataChannels(double timeout_s);
  // The channels and what they moved: count(kind), bytes(kind) (lanes' bytes are on no wire; data
  // channels' are counted in traffic() too), set_data_min_floats.
  WorkerChannels& channels() { return channels_; }
  const WorkerChannels& channels() const { return channels_; }

  // What the replies said: counts(), last_version_lag(), last_clock_staleness(), last_wait_ms().
  const PsReplies& replies() const { return requests_.replies(); }
  TrafficCounters traffic() const;

 private:
  PsClient(TransportContext& ctx, const wire::ClusterTable& table, int rank, std::vector<TensorInfo> layout,
           SchedulerClient* scheduler);
  // Push's part for shard s, through the channel that takes it. An error: the codec failed
  // (nothing sent to s).
  Status PushTo(int s, RequestId id, PsRequest& r, ConstFloatSpan grads, std::span<const uint64_t> keys,
                std::span<const float> values);

  TransportContext& ctx_;
  std::vector<TensorInfo> layout_;
  Partitioner partitioner_;
  std::vector<std::vector<Segment>> dense_runs_;  // per shard: the layout's dense runs in its range
  std::vector<int64_t> dense_floats_;             // per shard: their size (a step's whole request)
  ShardLinks links_;
  WorkerChannels channels_;
  PsCodec codec_;
  PsRequests requests_;
  PartPlan parts_;
  StateTransfer state_;
};

}  // namespace gradsync
