// LaneChannel: the values of a worker on this host in a shared-memory lane (common/net/shm_lane.h)
// that the worker made and the shard attached (CHANNEL_ATTACH). A push is read in place: its values
// stay in the lane, leased until applied or refused (the worker writes its next push there only
// once the shard has let the last one go); a pull is written into the lane in pieces, each
// announced as soon as it is written, so that the worker copies one piece out while the next is
// written. A detached lane stays mapped while a push in it is held.
#pragma once

#include <map>
#include <memory>

#include "common/net/shm_lane.h"
#include "server/channels/shard_channel.h"

namespace gradsync {

class LaneChannel : public ShardChannel {
 public:
  explicit LaneChannel(ChannelContext ctx) : ctx_(ctx) {}
  // CHANNEL_ATTACH: worker r.worker's lane (named by r.at.attach) over the whole of `shard`'s range.
  Status Attach(const PsRequest& r, const KvShard& shard);
  Result<PushValues> Push(const PsRequest& r, Message& m, const KvShard& shard) override;
  void Refuse(const PsRequest& r) override;
  Status CheckPull(const PsRequest& r, bool has_keys) const override;
  Result<bool> AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t> keys,
                          const KvShard& shard) override;
  void Detach(int worker) override;

 private:
  ChannelContext ctx_;
  std::map<int, std::shared_ptr<ShmLane>> lanes_;  // worker -> its lane
};

}  // namespace gradsync
