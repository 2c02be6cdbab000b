// DataChannel: the values of a worker's dense pushes and pulls on a TCP connection of their own
// (channels/data_listener.h; common/net/data_channel.h has the worker's side). CHANNEL_ATTACH hands the
// shard a token; the worker's connection presenting it carries the frames. A push's frame is
// taken when its header comes over ZeroMQ (the worker writes the frame first) and leased to the
// push until applied; a pull's frame is queued with the reply. Not in a job with CURVE: values
// stay on ZeroMQ, which encrypts them.
#pragma once

#include <memory>
#include <string>

#include "server/channels/data_listener.h"
#include "server/channels/shard_channel.h"

namespace gradsync {

struct DataChannelOptions {
  std::string bind_host = "127.0.0.1";
  // How long a push's frame's last bytes may take after its header came.
  double wait_s = 10.0;
  // Tests: once this many pulls (pushes) went over data channels, the channel of the worker of
  // the last one is dropped (a pull's frame queued, not sent), as a frame that ends it would (0: never).
  int64_t drop_after_pulls = 0;
  int64_t drop_after_pushes = 0;
};

class DataChannel : public ShardChannel {
 public:
  DataChannel(ChannelContext ctx, DataChannelOptions options) : ctx_(ctx), options_(std::move(options)) {}
  // CHANNEL_ATTACH: worker r.worker's connection will present r.at.attach (its token), for the whole of
  // `shard`'s range (`curve`: the job encrypts its traffic, refused). The port to connect to.
  Result<int> Attach(const PsRequest& r, const KvShard& shard, bool curve);
  Result<PushValues> Push(const PsRequest& r, Message& m, const KvShard& shard) override;
  void Refuse(const PsRequest& r) override;
  Status CheckPull(const PsRequest& r, bool has_keys) const override;
  Result<bool> AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t> keys,
                          const KvShard& shard) override;
  void Detach(int worker) override;
  // The bytes its connections moved (on the wire too).
  uint64_t bytes_sent() const { return listener_ ? listener_->bytes_sent() : 0; }
  uint64_t bytes_received() const { return listener_ ? listener_->bytes_received() : 0; }

 private:
  ChannelContext ctx_;
  DataChannelOptions options_;
  std::unique_ptr<DataListener> listener_;  // made at the first CHANNEL_ATTACH for a data channel
  int64_t pushes_ = 0;                      // taken from data channels (tests)
};

}  // namespace gradsync
