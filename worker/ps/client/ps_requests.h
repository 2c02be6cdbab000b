// PsRequests: a worker's requests to the shards in flight and the waiting for their replies:
// request ids, the table of pending requests (the shards each still waits for), sending a
// request (a failed send fails that shard's part of it), and Wait: it drives the sockets (polling
// first as the wait policy says), hands each reply to PsReplies, and fails a request at the
// server's ERROR, a shard the scheduler declared dead or restarted (or a lost scheduler), or the
// deadline: it never hangs on a dead shard. Also the one place that says whether a request's
// values may take a value channel beside ZeroMQ (raw values, the shard not dead).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "common/base/wait_policy.h"
#include "common/ps/ps_protocol.h"
#include "worker/channels/worker_channels.h"
#include "worker/ps/client/ps_codec.h"
#include "worker/ps/client/ps_replies.h"
#include "worker/ps/client/shard_links.h"

namespace gradsync {

class PsRequests {
 public:
  using RequestId = uint64_t;

  PsRequests(ShardLinks& links, WorkerChannels& channels, PsCodec& codec, const Partitioner& partitioner, int rank);

  // A new request awaiting `parts` replies (pulls: into `target`; STATE_PULL: into `state`).
  RequestId New(bool is_pull, FloatSpan target, int parts, std::shared_ptr<StateGather> state = nullptr);
  // Pull `id` brings table rows too: where they go (PsPending::rows).
  void SetRows(RequestId id, StepRows rows) { pending_[id].rows = rows; }
  // A request of this worker's: its type, id and clock.
  PsRequest Request(wire::Type type, RequestId id, int64_t clock) const;
  // Request `id` waits for a reply of shard s (one more message due).
  void Expect(RequestId id, int s);
  // Sends request r to shard s; a failed send fails the shard's part of it with `what` as
  // context. Send: r's id waits for the reply (Expect); Post: it already does.
  void Send(int s, const PsRequest& r, const Payload& p, const char* what);
  void Post(int s, const PsRequest& r, const Payload& p, const char* what);
  // Request r to shard s alone, and its reply (CHANNEL_ATTACH; WorkerChannels::Ask).
  Result<PsReply> Ask(int s, PsRequest r, double timeout_s);
  // Fails shard s's part of every request that waits for it.
  void FailShard(int s, const Status& why);

  // Until request `id` is answered by every shard, or failed (see above); a push's lent frames
  // are released when it returns OK.
  Status Wait(RequestId id, double timeout_s);
  // Processes the replies that have arrived, without waiting.
  void Poll() { (void)Receive(0); }
  // What a channel runs while it waits for shard s (WorkerChannel::Progress).
  Status Progress(int s);
  // A pull not answered yet, or pushed gradient bytes ZeroMQ still holds.
  bool InFlight() const;
  // Every outstanding request is void (the shards were reconnected).
  void ForgetAll() { pending_.clear(); }

  // Whether shard s may take a value channel beside ZeroMQ now (raw values, not dead).
  bool RawTo(int s) const { return codec_.raw() && !links_.broken(s); }
  // The pull of r.segments to shard s, through its channel if one takes it (`whole`: see
  // WorkerChannel::TakesPush): names it in r.at.
  void PullThrough(int s, RequestId id, PsRequest& r, int64_t whole);

  // How Wait, and a channel's wait for room, wait (common/base/wait_policy.h): before Wait sleeps
  // on the sockets, it polls them for up to policy.busy_poll_ms, yielding the core between polls
  // (0: it sleeps at once). A thread that sleeps needs waking when the reply comes, and a waking
  // thread may wait for a core (or, on a virtual machine, for its idle virtual CPU to be
  // scheduled again) much longer than the reply took (bench/README.md).
  void set_wait_policy(const WaitPolicy& policy) { wait_ = policy; }
  const WaitPolicy& wait_policy() const { return wait_; }
  // How many times Wait polled the sockets instead of sleeping on them (the polls the wait
  // policy asks for; 0 while its busy_poll_ms is 0), since this client was made.
  int64_t busy_polls() const { return busy_polls_; }
  const PsReplies& replies() const { return replies_; }

 private:
  // Handles the replies that arrive within timeout_ms; returns early once request `until` (if
  // not 0) is answered or failed.
  Status Receive(int timeout_ms, RequestId until = 0);
  void HandleReply(int shard, const Message& m);
  // The request a reply of `shard` answers, its message counted (more: a piece, the rest to
  // come); null for a late reply to a failed request, or a duplicate.
  PsPending* Answered(int shard, RequestId id, bool more);
  // Until ZeroMQ has released every lent gradient frame, except a dead shard's.
  void WaitForLentFrames();

  ShardLinks& links_;
  WorkerChannels& channels_;
  PsCodec& codec_;
  int rank_;
  PsReplies replies_;
  RequestId next_id_ = 1;
  std::map<RequestId, PsPending> pending_;
  WaitPolicy wait_{};       // set_wait_policy
  int64_t busy_polls_ = 0;  // busy_polls(): Wait's thread alone counts
};

}  // namespace gradsync
