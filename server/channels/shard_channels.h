// ShardChannels: the router over the shard's value channels (shard_channel.h). A request names
// its channel (PsRequest::at, a wire::Channel); For() hands it to that one.
// A worker has one way for its values at a time: attaching it to a lane or a data channel lets
// its room in the other go. Adding a channel touches this folder only.
#pragma once

#include "server/channels/data_channel.h"
#include "server/channels/lane_channel.h"
#include "server/channels/shard_channel.h"
#include "server/channels/zmq_channel.h"

namespace gradsync {

class ShardChannels {
 public:
  // `socket`, `codecs`: the shard's, which outlive this; `rank` for replies and logs.
  ShardChannels(Socket* socket, int rank, ShardCodecs* codecs, DataChannelOptions data);
  ShardChannels(const ShardChannels&) = delete;
  ShardChannels& operator=(const ShardChannels&) = delete;

  ShardChannel& For(const PsRequest& r);
  // Answers a validated pull (`reply` filled in but for its values) through the channel it names,
  // or over ZeroMQ, which every worker has, when that channel went while the pull was parked. An
  // error: the caller answers with it.
  Status AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t> keys,
                    const KvShard& shard);
  // CHANNEL_ATTACH: worker r.worker's room in the channel r.at names, for the whole of `shard`'s
  // range (`curve`: the job encrypts its traffic); the reply to send. Its room in the other goes.
  Result<PsReply> Attach(const PsRequest& r, const KvShard& shard, bool curve);
  // Worker w's rooms go (dead).
  void Detach(int worker);

  const ChannelCounts& counts() const { return counts_; }
  // The bytes moved outside ZeroMQ (which counts its own).
  uint64_t bytes_sent() const { return data_.bytes_sent(); }
  uint64_t bytes_received() const { return data_.bytes_received(); }

 private:
  int rank_;
  ChannelCounts counts_;
  ZmqChannel zmq_;
  LaneChannel lanes_;
  DataChannel data_;
};

}  // namespace gradsync
