// The shard's side of the value channels: how a push's values reach this shard and how a pull's
// leave it, whatever carries them (ps-lite's Van, gloo's Pair).
//
//   ZmqChannel   the values travel in the request and reply messages themselves (the default;
//                the only one with keys, codecs and CURVE);
//   LaneChannel  a shared-memory lane per worker on this host (common/net/shm_lane.h): pushes read
//                in place, pulls written into the lane in pieces;
//   DataChannel  a TCP connection per worker (channels/data_listener.h): push frames taken as they
//                come, pull frames queued with the reply.
//
// A request names its channel; ShardChannels (the router) hands it to that one, and nothing
// else in the shard knows which it was: the shard's loop asks for a push's values, lets a
// refused push's values go, and has a pull answered. A push's values stay where they came until
// the chunk that holds them goes (PushChunk::lease), so the shard applies them without a copy.
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"
#include "server/shard/kv/kv_shard.h"

namespace gradsync {

class ShardCodecs;

// Where a push message's values are: `n` floats at `values`, held by `lease` (null: in the
// message's own frame, which the chunk takes).
struct PushValues {
  const float* values = nullptr;
  size_t n = 0;
  std::shared_ptr<const float> lease;
};

// What the channels count, for the shard's summary.
struct ChannelCounts {
  int64_t shm_lanes = 0;         // lanes attached now
  int64_t shm_pulls = 0;         // pulls answered through a lane
  int64_t data_channels = 0;     // data channels connected now
  int64_t data_pulls = 0;        // pulls answered over a data channel
  int64_t compressed_pulls = 0;  // answered with a compressed delta (--compress-pull)
};

// What a channel works with: the shard's reply socket, its rank (for replies and logs), the
// job's codecs, and the counts.
struct ChannelContext {
  Socket* socket = nullptr;
  int rank = -1;
  ShardCodecs* codecs = nullptr;
  ChannelCounts* counts = nullptr;
};

class ShardChannel {
 public:
  virtual ~ShardChannel() = default;
  // A push message's values (checked: where this channel takes them from, and in `shard`'s range).
  virtual Result<PushValues> Push(const PsRequest& r, Message& m, const KvShard& shard) = 0;
  // A push refused, or the rest of a refused one: its values go (the worker may reuse the room).
  virtual void Refuse(const PsRequest& r) = 0;
  // Checks a pull that asks for its values through this channel (no keys, no codec where the
  // channel carries dense raw values only).
  virtual Status CheckPull(const PsRequest& r, bool has_keys) const = 0;
  // Answers a validated pull (`reply` filled in but for its values) from `shard`. False: this
  // channel cannot now (it went while the pull was parked), the caller answers over ZeroMQ; an
  // error: the caller answers with it.
  virtual Result<bool> AnswerPull(const PsRequest& r, const Message& m, PsReply& reply,
                                  std::span<const uint64_t> keys, const KvShard& shard) = 0;
  // Worker w's room in this channel goes (dead, or another channel replaces it).
  virtual void Detach(int worker) { (void)worker; }
};

// What a push through a lane or a data channel must be: dense raw values over contiguous
// segments in the shard's range (*n: their count); `what` names the channel in the error.
Status CheckDensePush(const PsRequest& r, const KvShard& shard, size_t* n, const char* what);
// What a pull through a lane or a data channel must ask for: dense raw values (no keys, no
// codec, and not in a job with --compress-pull).
Status CheckDensePull(const PsRequest& r, bool has_keys, bool compresses_pulls, const char* what);

}  // namespace gradsync
