// WorkerDataChannel: the worker's end of a data channel (common/net/data_channel.h) to one shard: a
// TCP connection of its own beside ZeroMQ. CHANNEL_ATTACH hands the shard a fresh random token and
// names the port; the worker connects and presents it. From then on a push's values go as a
// frame before their header, and a pull's answer is read off the connection straight into the
// destination when its header arrives. Requests below the threshold (min_floats) stay on ZeroMQ,
// which is as fast for them.
#pragma once

#include <memory>
#include <string>

#include "common/net/data_channel.h"
#include "worker/channels/worker_channel.h"

namespace gradsync {

class WorkerDataChannel : public WorkerChannel {
 public:
  // Has the shard at `host` open a channel over `range` (`ask`) and connects to it, within
  // timeout_s; requests of at least `min_floats` values take it.
  static Result<std::unique_ptr<WorkerDataChannel>> Attach(const std::string& host, const Segment& range,
                                                           size_t min_floats, const AskShard& ask, double timeout_s);

  wire::Channel kind() const override { return wire::CHANNEL_DATA; }
  bool TakesPush(std::span<const Segment> segments, int64_t whole) const override;
  bool TakesPull(std::span<const Segment> segments, int64_t whole) const override;
  Status OpenPush(const WaitPolicy&, const Progress&) override { return OkStatus(); }
  Status SendPush(const PushSource& v, ValueRef* at, Payload* p) override;
  void SendPull(RequestId, std::span<const Segment>, ValueRef* at) override { at->channel = wire::CHANNEL_DATA; }
  // Frames older than the reply's (their header was lost) are skipped. Every failure breaks it.
  Status ReadPull(const Message& m, const PsReply& r, float* target, Status* broke) override;
  void Forget(RequestId) override {}
  void ForgetAll() override {}
  ChannelBytes bytes() const override;

 private:
  WorkerDataChannel(DataStream stream, const Segment& range, size_t min_floats)
      : stream_(std::move(stream)), range_(range), min_floats_(min_floats) {}
  bool Large(std::span<const Segment> segments, int64_t whole) const;
  // ReadPull's frame; an error: the channel broke.
  Status ReadFrame(const PsReply& r, float* target);

  DataStream stream_;
  Segment range_;
  size_t min_floats_;
  uint64_t sent_ = 0;  // push frames written
  uint64_t pushed_ = 0, pulled_ = 0;
};

}  // namespace gradsync
