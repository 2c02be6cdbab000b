#include "server/channels/data_channel.h"

#include <vector>

#include "common/base/logging.h"
#include "server/requests/shard_codecs.h"

namespace gradsync {

Result<int> DataChannel::Attach(const PsRequest& r, const KvShard& shard, bool curve) {
  if (r.has_values || r.num_keys > 0) return InvalidArgumentError("CHANNEL_ATTACH carries no values");
  if (r.segments.size() != 1 || r.segments[0] != shard.range()) {
    return InvalidArgumentError("a data channel covers exactly this shard's range [" +
                                std::to_string(shard.range().begin) + ", " + std::to_string(shard.range().end) + ")");
  }
  if (curve) {
    return FailedPreconditionError("this job uses CURVE (--auth-dir): values stay on ZeroMQ, which encrypts them");
  }
  if (!listener_) {
    const std::string host = options_.bind_host == "*" ? std::string("0.0.0.0") : options_.bind_host;
    ASSIGN_OR_RETURN(listener_, DataListener::Create(host));
    GRADSYNC_LOG(INFO) << "server " << ctx_.rank << ": data channel on port " << listener_->port();
  }
  listener_->Drop(r.worker);  // a connection it had goes
  listener_->Expect(r.at.attach, r.worker, shard.range().size());
  return listener_->port();
}

Result<PushValues> DataChannel::Push(const PsRequest& r, Message&, const KvShard& shard) {
  if (r.has_values) return InvalidArgumentError("a data-channel push carries no values frame");
  // A worker does not write a frame into a channel the shard closed (DataStream::WriteFrame);
  // one that broke after the frame was written fails the push.
  auto conn = listener_ ? listener_->Find(r.worker) : nullptr;
  if (!conn) return FailedPreconditionError("a data-channel push, but worker " + std::to_string(r.worker) + " has no data channel");
  PushValues v;
  v.n = static_cast<size_t>(TotalSize(r.segments));
  RETURN_IF_ERROR(CheckDensePush(r, shard, &v.n, "a data-channel"));
  ctx_.counts->data_channels = static_cast<int64_t>(listener_->size());
  // The worker wrote the frame before it sent this header: only its last bytes may be in flight.
  ASSIGN_OR_RETURN(v.lease, conn->TakePush(r.at.seq, v.n, options_.wait_s));
  v.values = v.lease.get();
  if (++pushes_ == options_.drop_after_pushes) listener_->Drop(r.worker);  // tests
  return v;
}

void DataChannel::Refuse(const PsRequest& r) {
  if (!listener_) return;
  if (auto conn = listener_->Find(r.worker)) conn->DropPush(r.at.seq);
}

Status DataChannel::CheckPull(const PsRequest& r, bool has_keys) const {
  // One whose channel is gone (the worker may not know yet) is answered over ZeroMQ, as one
  // whose channel goes while it is parked (AnswerPull).
  return CheckDensePull(r, has_keys, ctx_.codecs->compresses_pulls(), "a data-channel");
}

Result<bool> DataChannel::AnswerPull(const PsRequest& r, const Message& m, PsReply& reply, std::span<const uint64_t>,
                                     const KvShard& shard) {
  auto conn = listener_ ? listener_->Find(r.worker) : nullptr;
  if (!conn || !conn->health().ok()) return false;  // gone while the pull was parked: over ZeroMQ
  // One run: written straight from the parameters, which the frame holds (KvShard::Share) so
  // the next update writes a fresh copy; several: one snapshot.
  std::vector<std::span<const float>> values;
  std::shared_ptr<const void> owner;
  const int64_t base = shard.range().begin;
  if (r.segments.size() == 1) {
    const Segment& seg = r.segments[0];
    values.push_back(shard.params().subspan(static_cast<size_t>(seg.begin - base), static_cast<size_t>(seg.size())));
    owner = shard.Share();
  } else {
    auto snapshot = std::make_shared<std::vector<float>>(static_cast<size_t>(TotalSize(r.segments)));
    shard.Read(r.segments, {}, snapshot->data());
    values.push_back(*snapshot);
    owner = std::move(snapshot);
  }
  // Tests: this pull's frame is never sent, and the channel goes.
  const bool drop = ctx_.counts->data_pulls + 1 == options_.drop_after_pulls;
  auto seq = drop ? Result<uint64_t>(uint64_t{1}) : conn->SendPull(std::move(values), std::move(owner));
  if (!seq.ok()) return false;
  reply.at.channel = wire::CHANNEL_DATA;
  reply.at.seq = *seq;
  Status s = ctx_.socket->Send(m.peer, EncodeReply(reply));
  if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << ctx_.rank << ": pull reply to worker " << r.worker << ": " << s;
  ctx_.counts->data_pulls++;
  if (drop) {
    conn.reset();
    listener_->Drop(r.worker);
  }
  ctx_.counts->data_channels = static_cast<int64_t>(listener_->size());
  return true;
}

void DataChannel::Detach(int worker) {
  if (listener_) listener_->Drop(worker);
}

}  // namespace gradsync
