// The worker's side of the value channels to one shard: how a push's values reach the shard and
// how a pull's come back, when not in the ZeroMQ messages themselves (the shard's side:
// server/channels/shard_channel.h).
//
//   WorkerZmqChannel   the request's own ZeroMQ frames, every shard's: a dense run lent to ZeroMQ
//                      (no copy), several runs or keys copied, a codec's frame; pull replies copied
//                      out of their frames;
//   WorkerLane         a shared-memory lane (common/net/shm_lane.h), shards on this host: pushes
//                      written into the lane's push area, pulls read from its pull area;
//   WorkerDataChannel  a TCP connection of its own (common/net/data_channel.h): push frames written
//                      before their headers, pull frames read straight into the destination.
//
// A request no channel beside ZeroMQ takes (keys, a codec, too small, or none attached) takes
// ZeroMQ's. PsClient asks WorkerChannels (the router) for a shard's channel, and names it in the
// request (PsRequest::at); nothing else in the client knows which it was.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "common/base/numeric/segment.h"
#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/base/wait_policy.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

// Value bytes a channel moved (pushed, pulled), and the bytes it put on a wire of its own (a lane
// has none; ZeroMQ counts its own).
struct ChannelBytes {
  uint64_t pushed = 0;
  uint64_t pulled = 0;
  uint64_t wire_sent = 0;
  uint64_t wire_received = 0;
};

// A push's values for one shard: its dense runs of `grads` and its sparse (key, value) pairs, or
// (with a codec) the encoding of its dense runs. Only ZeroMQ's channel takes keys or an encoding.
struct PushSource {
  std::span<const Segment> runs;
  ConstFloatSpan grads;
  std::span<const uint64_t> keys = {};
  std::span<const float> values = {};
  Frame* encoded = nullptr;  // the codec's frame (moved into the message); then no keys
  // The bytes the push's trace names: the encoding's, else the values' and keys'.
  double bytes() const {
    return encoded ? static_cast<double>(encoded->size())
                   : static_cast<double>((TotalSize(runs) + values.size()) * sizeof(float) + keys.size() * sizeof(uint64_t));
  }
};

class WorkerChannel {
 public:
  using RequestId = uint64_t;
  // What a channel runs while it waits for its shard: handles the replies that arrive (and the
  // scheduler's news); an error ends the wait.
  using Progress = std::function<Status()>;

  virtual ~WorkerChannel() = default;
  virtual wire::Channel kind() const = 0;

  // Whether a dense raw push (pull) of `segments`, part of a request of `whole` floats to this
  // shard (the threshold is compared with it, so that a request's parts go the way it would go
  // whole), may take this channel now.
  virtual bool TakesPush(std::span<const Segment> segments, int64_t whole) const = 0;
  virtual bool TakesPull(std::span<const Segment> segments, int64_t whole) const = 0;

  // Opens a push through this channel: waits (polling as `wait` says, then running `progress`)
  // until the shard has let go of the previous one where the channel holds one push at a time.
  // An error: the shard did not.
  virtual Status OpenPush(const WaitPolicy& wait, const Progress& progress) = 0;
  // Sends `v` (dense runs, contiguous, beside ZeroMQ) of the open push and names them in *at, or
  // puts them in the ZeroMQ message's own frames (*p). An error: the channel broke and sent
  // nothing usable (the caller drops it; the values go over ZeroMQ).
  virtual Status SendPush(const PushSource& v, ValueRef* at, Payload* p) = 0;

  // A pull of `segments` for request `id` through this channel: named in *at.
  virtual void SendPull(RequestId id, std::span<const Segment> segments, ValueRef* at) = 0;
  // Reads the values of pull reply `r` (message m) through this channel (its segments, checked to
  // be in the shard's range) into `target` (the flat buffer; null: past them, the reply is not
  // used). An error: the values do not fit (the request fails). *broke: the channel broke instead
  // and read nothing usable (the caller drops it and asks again over ZeroMQ).
  virtual Status ReadPull(const Message& m, const PsReply& r, float* target, Status* broke) = 0;
  // Request `id` is answered by this shard, or void: the channel forgets it.
  virtual void Forget(RequestId id) = 0;
  // Every request is void (the shards were reconnected).
  virtual void ForgetAll() = 0;

  // ZeroMQ's channel moves no bytes of its own: the sockets count them.
  virtual ChannelBytes bytes() const = 0;
};

// Sends a request to the channel's shard and waits (at most timeout_s) for its reply: how a
// channel is attached (the client's request ids, sockets and waiting).
using AskShard = std::function<Result<PsReply>(PsRequest r, double timeout_s)>;

}  // namespace gradsync
