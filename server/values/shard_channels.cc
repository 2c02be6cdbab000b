#include "server/values/shard_channels.h"

namespace gradsync {

ShardChannels::ShardChannels(Socket* socket, int rank, ShardCodecs* codecs, DataChannelOptions data)
    : rank_(rank),
      zmq_({socket, rank, codecs, &counts_}),
      lanes_({socket, rank, codecs, &counts_}),
      data_({socket, rank, codecs, &counts_}, std::move(data)) {}

ShardChannel& ShardChannels::For(const PsRequest& r) {
  if (r.shm) return lanes_;
  if (r.data) return data_;
  return zmq_;
}

Status ShardChannels::AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t> keys,
                                 const KvShard& shard) {
  ShardChannel& named = For(r);
  ASSIGN_OR_RETURN(const bool answered, named.AnswerPull(r, m, reply, keys, shard));
  if (answered || &named == &zmq_) return OkStatus();
  return zmq_.AnswerPull(r, m, reply, keys, shard).status();
}

Result<PsReply> ShardChannels::Attach(const PsRequest& r, const Message& m, const KvShard& shard, bool curve) {
  if (r.type == wire::SHM_ATTACH) {
    RETURN_IF_ERROR(lanes_.Attach(r, m, shard));
    data_.Detach(r.worker);
    return ReplyTo(r, wire::SHM_ATTACH_REPLY, rank_);
  }
  if (r.type != wire::DATA_ATTACH) return InvalidArgumentError("not a request to attach a channel");
  ASSIGN_OR_RETURN(const int port, data_.Attach(r, m, shard, curve));
  lanes_.Detach(r.worker);
  PsReply reply = ReplyTo(r, wire::DATA_ATTACH_REPLY, rank_);
  reply.data_port = port;
  return reply;
}

void ShardChannels::Detach(int worker) {
  lanes_.Detach(worker);
  data_.Detach(worker);
}

}  // namespace gradsync
