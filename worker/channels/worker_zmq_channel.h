// WorkerZmqChannel: the values a request to one shard carries in its own ZeroMQ frames, every
// shard's channel (the one for keys and codecs, and for whatever no channel beside it takes). A
// dense push of one run lends the gradient buffer to ZeroMQ (no copy): the buffer must not change
// until ZeroMQ has let go of it (lent()); several runs, or keys, are copied into the message; a
// codec's frame is moved into it. A pull reply's values are copied out of its frames, its keys
// checked to be in the shard's range. ZeroMQ counts its own bytes (the sockets' traffic).
#pragma once

#include <memory>
#include <vector>

#include "worker/channels/worker_channel.h"

namespace gradsync {

class WorkerZmqChannel : public WorkerChannel {
 public:
  explicit WorkerZmqChannel(const Segment& range) : range_(range), lent_(std::make_shared<InflightCounter>()) {}

  wire::Channel kind() const override { return wire::CHANNEL_ZMQ; }
  bool TakesPush(std::span<const Segment>, int64_t) const override { return true; }
  bool TakesPull(std::span<const Segment>, int64_t) const override { return true; }
  Status OpenPush(const WaitPolicy&, const Progress&) override { return OkStatus(); }
  Status SendPush(const PushSource& v, ValueRef* at, Payload* p) override;
  void SendPull(RequestId, std::span<const Segment>, ValueRef*) override {}
  Status ReadPull(const Message& m, const PsReply& r, float* target, Status* broke) override;
  void Forget(RequestId) override {}
  void ForgetAll() override {}
  ChannelBytes bytes() const override { return {}; }

  // Gradient frames ZeroMQ still holds (lent, not yet written to the socket).
  int lent() const { return lent_->count(); }

 private:
  Segment range_;
  std::shared_ptr<InflightCounter> lent_;
  // Buffers reused across requests: a push's copied values, a pull reply's keys and their values.
  std::vector<float> values_;
  std::vector<uint64_t> keys_;
  std::vector<float> key_values_;
};

}  // namespace gradsync
