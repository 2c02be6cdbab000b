#include "server/channels/zmq_channel.h"

#include "common/base/logging.h"
#include "server/requests/shard_codecs.h"

namespace gradsync {

Result<PushValues> ZmqChannel::Push(const PsRequest& r, Message& m, const KvShard&) {
  if (!r.has_values) return InvalidArgumentError("a push carries values");
  return PushValues{static_cast<const float*>(m.values.data()), m.num_values(), nullptr};
}

void ZmqChannel::Send(const PsRequest& r, const Message& m, const PsReply& reply, const Payload& p) {
  Status s = ctx_.socket->Send(m.peer, EncodeReply(reply), p);
  if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << ctx_.rank << ": pull reply to worker " << r.worker << ": " << s;
}

Result<bool> ZmqChannel::AnswerPull(const PsRequest& r, const Message& m, PsReply& reply,
                                    std::span<const uint64_t> keys, const KvShard& shard) {
  const uint64_t n = r.tables.empty() ? keys.size() + TotalSize(r.segments) : shard.tables().Floats(r.tables);
  ShardCodecs& codecs = *ctx_.codecs;
  Payload p;
  p.has_values = true;
  Frame frame;
  if (!r.codec.empty()) {
    auto encoded = codecs.EncodePull(r, shard, &frame);
    if (!encoded.ok()) GRADSYNC_LOG(ERROR) << "server " << ctx_.rank << ": " << encoded.status();
    if (encoded.ok() && *encoded) {
      reply.codec = codecs.spec();
      p.values_frame = &frame;
      Send(r, m, reply, p);
      ctx_.counts->compressed_pulls++;
      return true;
    }
  }
  if (keys.empty() && r.segments.size() == 1) {
    // One run: sent straight from the parameters, no copy. The reply holds them, so the next
    // update writes a fresh copy instead (KvShard::Share): the reply stays one version.
    const Segment& seg = r.segments[0];
    p.values = shard.params().subspan(static_cast<size_t>(seg.begin - shard.range().begin), static_cast<size_t>(seg.size()));
    p.owner = shard.Share();
    codecs.Sent(r, p.values.data());
    Send(r, m, reply, p);
    return true;
  }
  // Several runs or keys: a snapshot (the shard may change before ZeroMQ has sent the bytes),
  // one copy into a pooled buffer that ZeroMQ sends without copying again.
  LentBufferPool::Buffer* buf = reply_pool_.Acquire(n);
  float* dst = nullptr;
  if (buf) {
    dst = buf->values.data();
  } else {
    frame = Frame(n * sizeof(float));
    dst = static_cast<float*>(frame.data());
  }
  shard.Read(r.segments, keys, dst, r.tables);
  if (keys.empty()) codecs.Sent(r, dst);
  // Keys are echoed, so that a reply describes itself.
  if (buf) {
    buf->keys.assign(keys.begin(), keys.end());  // lent frames must outlive this function
    p.values = std::span<const float>(buf->values.data(), n);
    p.keys = buf->keys;
    p.lent = buf->inflight;
  } else {
    p.values_frame = &frame;
    p.keys = keys;
  }
  Send(r, m, reply, p);
  return true;
}

}  // namespace gradsync
