// WorkerChannels: the router over a worker's value channels (worker_channel.h): per shard, ZeroMQ's
// own (always) and at most one beside it: a shared-memory lane to a shard on this host, else a
// data channel (not with CURVE: values stay encrypted on ZeroMQ). It attaches them, picks the
// channel a request takes, falls back to ZeroMQ's when one breaks (dropping it), and counts what
// every channel moved, the dropped ones' included. Adding a channel touches this folder only.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/ps/partitioner.h"
#include "worker/channels/worker_channel.h"
#include "worker/channels/worker_zmq_channel.h"

namespace gradsync {

class WorkerChannels {
 public:
  // Sends a request to shard s and waits for its reply (the client's requests and sockets).
  using Ask = std::function<Result<PsReply>(int shard, PsRequest r, double timeout_s)>;

  // `table` and `partitioner` are the client's, which outlive this (Reconnect updates the table's
  // addresses); `rank` for logs and to find this worker's host.
  WorkerChannels(int rank, const wire::ClusterTable& table, const Partitioner& partitioner, Ask ask);

  // A lane to every shard on this host without one (its address a loopback one or this worker's
  // own host). A shard that refuses goes on without (a warning says why); a deadline or a refused
  // authentication ends it. Returns the lanes attached.
  Result<int> AttachLanes(double timeout_s);
  // A data channel to every shard without a channel (none with `curve`), as AttachLanes.
  Result<int> AttachData(double timeout_s, bool curve);
  // `shards` were reconnected: their old channels go (Retire), and what was attached before is attached
  // again (refusals are warnings), each within timeout_s() then.
  void Reattach(std::span<const int> shards, const std::function<double()>& timeout_s, bool curve);

  // The channel a push of `v` (a pull of `segments`) to shard s takes: the one beside ZeroMQ when
  // `beside` (raw values, the shard not dead), v has no keys nor encoding and that channel takes
  // it (`whole`: see WorkerChannel::TakesPush); else ZeroMQ's.
  WorkerChannel& ForPush(int s, const PushSource& v, int64_t whole, bool beside);
  WorkerChannel& ForPull(int s, std::span<const Segment> segments, int64_t whole, bool beside);
  // Sends v through `way` (ForPush's, opened) into *at and *p; where `way` broke, it is dropped and
  // v goes in the ZeroMQ message instead.
  void SendPush(int s, WorkerChannel& way, const PushSource& v, ValueRef* at, Payload* p);
  // Pull reply r (message m) of shard s: its values into `target` from the channel it names. True
  // once taken; false when that channel broke (dropped: the caller asks again over ZeroMQ); an
  // error for values that do not fit.
  Result<bool> TakePull(int s, const Message& m, const PsReply& r, float* target);
  // A pull reply not taken: its values are read past on the channel it names (one that breaks
  // is dropped), so that the next come off it in order.
  void SkipPull(int s, const Message& m, const PsReply& r);
  // Gradient frames of shard s that ZeroMQ still holds (lent by its pushes).
  int lent(int s) const { return zmq_[static_cast<size_t>(s)]->lent(); }
  // Shard s's channel broke: it goes, with a warning saying why (its bytes still count).
  void Drop(int s, const Status& why);
  // Shard s's channel goes (its server was replaced); its bytes still count.
  void Retire(int s);
  // Shard s answered request `id` in full: its channel forgets it.
  void Forget(int s, WorkerChannel::RequestId id);
  // Every request is void (the caller reconnected).
  void ForgetAll();

  // Shard s's channel of `kind`, if it has that one now (CHANNEL_ZMQ: always).
  WorkerChannel* Of(int s, wire::Channel kind) const;
  // Channels beside ZeroMQ of `kind` attached now.
  int count(wire::Channel kind) const;
  // What the channels of `kind` moved, the dropped ones' included.
  ChannelBytes bytes(wire::Channel kind) const;
  // Bytes on the channels' own wires, every kind (ZeroMQ's are the sockets').
  ChannelBytes wire_bytes() const;
  void set_data_min_floats(size_t n) { data_min_floats_ = std::max<size_t>(1, n); }
  size_t data_min_floats() const { return data_min_floats_; }

 private:
  bool IsLocal(int s) const;
  Result<std::unique_ptr<WorkerChannel>> Lane(int s, double timeout_s);
  Result<std::unique_ptr<WorkerChannel>> Data(int s, double timeout_s);
  // Attaches `attach` to each of `shards`; one that refuses is used without (a warning ending in
  // `refused` and the reason). `strict`: a deadline or refused authentication ends it.
  Status AttachEach(std::span<const int> shards, const std::function<double()>& timeout_s,
                    Result<std::unique_ptr<WorkerChannel>> (WorkerChannels::*attach)(int, double),
                    const char* refused, bool strict);

  int rank_;
  const wire::ClusterTable& table_;
  const Partitioner& partitioner_;
  Ask ask_;
  std::vector<std::unique_ptr<WorkerZmqChannel>> zmq_;    // per shard
  std::vector<std::unique_ptr<WorkerChannel>> channels_;  // per shard, beside ZeroMQ; null: none
  bool lanes_wanted_ = false, data_wanted_ = false;       // AttachLanes, AttachData were called
  size_t data_min_floats_ = size_t{1} << 20;  // 4 MiB: below it ZeroMQ is as fast (bench/README.md)
  std::array<ChannelBytes, wire::Channel_ARRAYSIZE> retired_{};     // per wire::Channel: of the channels that went
};

}  // namespace gradsync
