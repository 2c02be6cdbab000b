#include "server/channels/shard_channels.h"

namespace gradsync {

ShardChannels::ShardChannels(Socket* socket, int rank, ShardCodecs* codecs, DataChannelOptions data)
    : rank_(rank),
      zmq_({socket, rank, codecs, &counts_}),
      lanes_({socket, rank, codecs, &counts_}),
      data_({socket, rank, codecs, &counts_}, std::move(data)) {}

ShardChannel& ShardChannels::For(const PsRequest& r) {
  switch (r.at.channel) {
    case wire::CHANNEL_LANE: return lanes_;
    case wire::CHANNEL_DATA: return data_;
    default: return zmq_;
  }
}

Status ShardChannels::AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t> keys,
                                 const KvShard& shard) {
  ShardChannel& named = For(r);
  ASSIGN_OR_RETURN(const bool answered, named.AnswerPull(r, m, reply, keys, shard));
  if (answered || &named == &zmq_) return OkStatus();
  return zmq_.AnswerPull(r, m, reply, keys, shard).status();
}

Result<PsReply> ShardChannels::Attach(const PsRequest& r, const KvShard& shard, bool curve) {
  if (r.type != wire::CHANNEL_ATTACH) return InvalidArgumentError("not a request to attach a channel");
  PsReply reply = ReplyTo(r, wire::CHANNEL_ATTACH_REPLY, rank_);
  reply.at.channel = r.at.channel;
  switch (r.at.channel) {
    case wire::CHANNEL_LANE:
      RETURN_IF_ERROR(lanes_.Attach(r, shard));
      data_.Detach(r.worker);
      return reply;
    case wire::CHANNEL_DATA: {
      ASSIGN_OR_RETURN(reply.at.port, data_.Attach(r, shard, curve));
      lanes_.Detach(r.worker);
      return reply;
    }
    default: return InvalidArgumentError("ZeroMQ is every worker's channel: nothing to attach");
  }
}

void ShardChannels::Detach(int worker) {
  lanes_.Detach(worker);
  data_.Detach(worker);
}

}  // namespace gradsync
