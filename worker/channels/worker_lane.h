// WorkerLane: the worker's end of a shared-memory lane (common/net/shm_lane.h) to one shard on this
// host. The worker makes the lane and attaches it with CHANNEL_ATTACH; from then on a push's
// values are written into the push area (once the shard has let go of the previous push) and a
// pull's answer is read from the pull area. Only headers go over ZeroMQ.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "common/net/shm_lane.h"
#include "worker/channels/worker_channel.h"

namespace gradsync {

class WorkerLane : public WorkerChannel {
 public:
  // Makes a lane over `range` and has the shard attach it (`ask`), within timeout_s.
  static Result<std::unique_ptr<WorkerLane>> Attach(const Segment& range, const AskShard& ask, double timeout_s);

  wire::Channel kind() const override { return wire::CHANNEL_LANE; }
  bool TakesPush(std::span<const Segment> segments, int64_t whole) const override;
  bool TakesPull(std::span<const Segment> segments, int64_t whole) const override;
  Status OpenPush(const WaitPolicy& wait, const Progress& progress) override;
  Status SendPush(const PushSource& v, ValueRef* at, Payload* p) override;
  void SendPull(RequestId id, std::span<const Segment> segments, ValueRef* at) override;
  Status ReadPull(const Message& m, const PsReply& r, float* target, Status* broke) override;
  void Forget(RequestId id) override;
  void ForgetAll() override { pulls_.clear(); }
  ChannelBytes bytes() const override { return bytes_; }

 private:
  WorkerLane(ShmLane lane, const Segment& range) : lane_(std::move(lane)), range_(range) {}

  ShmLane lane_;
  Segment range_;
  uint64_t sent_ = 0;  // pushes opened on the push area (the open one's number)
  std::vector<std::pair<RequestId, Segment>> pulls_;  // pulls not fully answered yet
  ChannelBytes bytes_;
};

}  // namespace gradsync
