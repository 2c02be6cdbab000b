// ZmqChannel: a push's values in its own message, a pull's in its reply (ShardChannel).
//
// A push's frame is kept as it came (PushChunk takes it) where it is float-aligned; a pull of
// one run is sent straight from the parameters (the reply holds them: KvShard::Share), several
// runs or keys from one copy into a pooled buffer ZeroMQ sends without copying again, and with
// the job's --compress-pull a pull that asks for it as a compressed delta (ShardCodecs).
#pragma once

#include "server/channels/shard_channel.h"

namespace gradsync {

class ZmqChannel : public ShardChannel {
 public:
  explicit ZmqChannel(ChannelContext ctx) : ctx_(ctx) {}
  Result<PushValues> Push(const PsRequest& r, Message& m, const KvShard& shard) override;
  void Refuse(const PsRequest&) override {}
  Status CheckPull(const PsRequest&, bool) const override { return OkStatus(); }
  Result<bool> AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t> keys,
                          const KvShard& shard) override;

 private:
  void Send(const PsRequest& r, const Message& m, const PsReply& reply, const Payload& p);

  ChannelContext ctx_;
  LentBufferPool reply_pool_;
};

}  // namespace gradsync
