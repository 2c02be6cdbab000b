#include "server/channels/lane_channel.h"

#include <algorithm>
#include <vector>

#include "common/base/logging.h"
#include "server/requests/shard_codecs.h"

namespace gradsync {

Status LaneChannel::Attach(const PsRequest& r, const KvShard& shard) {
  if (r.has_values || r.num_keys > 0) return InvalidArgumentError("CHANNEL_ATTACH carries no values");
  if (r.segments.size() != 1 || r.segments[0] != shard.range()) {
    return InvalidArgumentError("a lane covers exactly this shard's range [" + std::to_string(shard.range().begin) +
                                ", " + std::to_string(shard.range().end) + ")");
  }
  ASSIGN_OR_RETURN(ShmLane lane, ShmLane::Attach(r.at.attach, shard.range().size()));
  lanes_[r.worker] = std::make_shared<ShmLane>(std::move(lane));
  ctx_.counts->shm_lanes = static_cast<int64_t>(lanes_.size());
  return OkStatus();
}

Result<PushValues> LaneChannel::Push(const PsRequest& r, Message&, const KvShard& shard) {
  if (r.has_values) return InvalidArgumentError("a shared-memory push carries no values frame");
  auto it = lanes_.find(r.worker);
  if (it == lanes_.end()) return FailedPreconditionError("a shared-memory push, but worker " + std::to_string(r.worker) + " attached no lane");
  PushValues v;
  v.n = static_cast<size_t>(TotalSize(r.segments));
  RETURN_IF_ERROR(CheckDensePush(r, shard, &v.n, "a shared-memory"));
  // Held until the last copy of the lease goes: then the shard is done reading it and the worker
  // may write its push area again. The lease keeps the lane mapped, even once detached.
  std::shared_ptr<ShmLane> lane = it->second;
  const uint64_t seq = r.at.seq;
  v.values = lane->push_area() + (r.segments[0].begin - shard.range().begin);
  v.lease = std::shared_ptr<const float>(v.values, [lane, seq](const float*) { lane->Consume(seq); });
  return v;
}

void LaneChannel::Refuse(const PsRequest& r) {
  auto it = lanes_.find(r.worker);
  if (it != lanes_.end() && r.at.seq != 0) it->second->Consume(r.at.seq);
}

Status LaneChannel::CheckPull(const PsRequest& r, bool has_keys) const {
  RETURN_IF_ERROR(CheckDensePull(r, has_keys, ctx_.codecs->compresses_pulls(), "a shared-memory"));
  if (!lanes_.count(r.worker)) {
    return FailedPreconditionError("a shared-memory pull, but worker " + std::to_string(r.worker) + " attached no lane");
  }
  return OkStatus();
}

Result<bool> LaneChannel::AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t>,
                                     const KvShard& shard) {
  auto it = lanes_.find(r.worker);
  if (it == lanes_.end()) {  // detached while the pull was parked
    return FailedPreconditionError("worker " + std::to_string(r.worker) + "'s lane is gone");
  }
  // In pieces, each announced as soon as it is written: the worker copies one piece out while
  // the next is written, so a large pull costs about one copy's time, not two. All pieces are
  // written before anything else is handled: the answer is one version.
  const int64_t total = static_cast<int64_t>(TotalSize(r.segments));
  const int64_t piece = std::clamp<int64_t>(total / 8, int64_t{1} << 16, int64_t{1} << 20);
  std::vector<Segment> pieces;
  for (const Segment& seg : r.segments) {
    for (int64_t b = seg.begin; b < seg.end; b += piece) pieces.push_back({b, std::min(seg.end, b + piece)});
  }
  const int64_t base = shard.range().begin;
  if (pieces.empty()) pieces.push_back({base, base});
  float* area = it->second->pull_area();
  reply.at.channel = wire::CHANNEL_LANE;
  reply.piece.parts = pieces.size() > 1 ? static_cast<int>(pieces.size()) : 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Segment& one = pieces[i];
    shard.Read({&one, 1}, {}, area + (one.begin - base));
    reply.piece.part = reply.piece.parts > 1 ? static_cast<int>(i) : 0;
    reply.segments = {one};
    Status s = ctx_.socket->Send(m.peer, EncodeReply(reply));
    if (!s.ok()) {
      GRADSYNC_LOG(WARNING) << "server " << ctx_.rank << ": pull reply to worker " << r.worker << ": " << s;
      break;
    }
  }
  ctx_.counts->shm_pulls++;
  return true;
}

void LaneChannel::Detach(int worker) {
  if (!lanes_.erase(worker)) return;
  ctx_.counts->shm_lanes = static_cast<int64_t>(lanes_.size());
}

}  // namespace gradsync
