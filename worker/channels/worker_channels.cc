#include "worker/channels/worker_channels.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/net/control/node.h"
#include "worker/channels/worker_data_channel.h"
#include "worker/channels/worker_lane.h"

namespace gradsync {
namespace {
constexpr const char* kNoLane = " takes no shared-memory lane (values go over TCP): ";
constexpr const char* kNoDataChannel = " takes no data channel (values go over ZeroMQ): ";

void Add(const ChannelBytes& b, ChannelBytes* sum) {
  sum->pushed += b.pushed;
  sum->pulled += b.pulled;
  sum->wire_sent += b.wire_sent;
  sum->wire_received += b.wire_received;
}
}  // namespace

WorkerChannels::WorkerChannels(int rank, const wire::ClusterTable& table, const Partitioner& partitioner, Ask ask)
    : rank_(rank), table_(table), partitioner_(partitioner), ask_(std::move(ask)) {
  channels_.resize(static_cast<size_t>(table.servers_size()));
  for (int s = 0; s < table.servers_size(); ++s) zmq_.push_back(std::make_unique<WorkerZmqChannel>(partitioner.range(s)));
}

bool WorkerChannels::IsLocal(int s) const {
  const std::string& h = table_.servers(s).host();
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0) return true;
  for (const auto& w : table_.workers())
    if (w.rank() == rank_) return !w.host().empty() && w.host() == h;
  return false;
}

Result<std::unique_ptr<WorkerChannel>> WorkerChannels::Lane(int s, double timeout_s) {
  auto ask = [this, s](PsRequest r, double t) { return ask_(s, std::move(r), t); };
  ASSIGN_OR_RETURN(auto lane, WorkerLane::Attach(partitioner_.range(s), ask, timeout_s));
  return std::unique_ptr<WorkerChannel>(std::move(lane));
}

Result<std::unique_ptr<WorkerChannel>> WorkerChannels::Data(int s, double timeout_s) {
  auto ask = [this, s](PsRequest r, double t) { return ask_(s, std::move(r), t); };
  ASSIGN_OR_RETURN(auto data, WorkerDataChannel::Attach(table_.servers(s).host(), partitioner_.range(s),
                                                        data_min_floats_, ask, timeout_s));
  return std::unique_ptr<WorkerChannel>(std::move(data));
}

Status WorkerChannels::AttachEach(std::span<const int> shards, const std::function<double()>& timeout_s,
                                  Result<std::unique_ptr<WorkerChannel>> (WorkerChannels::*attach)(int, double),
                                  const char* refused, bool strict) {
  for (int s : shards) {
    auto channel = (this->*attach)(s, timeout_s());
    if (channel.ok()) {
      channels_[static_cast<size_t>(s)] = std::move(channel).value();
      continue;
    }
    const Status& st = channel.status();
    if (strict && (st.code() == StatusCode::kDeadlineExceeded || st.code() == StatusCode::kUnauthenticated)) return st;
    GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": " << NodeName(table_.servers(s)) << refused << st;
  }
  return OkStatus();
}

Result<int> WorkerChannels::AttachLanes(double timeout_s) {
  lanes_wanted_ = true;
  std::vector<int> shards;
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (!channels_[static_cast<size_t>(s)] && IsLocal(s)) shards.push_back(s);
  }
  RETURN_IF_ERROR(AttachEach(shards, [&] { return timeout_s; }, &WorkerChannels::Lane, kNoLane, true));
  return count(wire::CHANNEL_LANE);
}

Result<int> WorkerChannels::AttachData(double timeout_s, bool curve) {
  data_wanted_ = true;
  if (curve) return 0;  // CURVE: values stay encrypted on ZeroMQ
  std::vector<int> shards;
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (!channels_[static_cast<size_t>(s)]) shards.push_back(s);
  }
  RETURN_IF_ERROR(AttachEach(shards, [&] { return timeout_s; }, &WorkerChannels::Data, kNoDataChannel, true));
  return count(wire::CHANNEL_DATA);
}

void WorkerChannels::Reattach(std::span<const int> shards, const std::function<double()>& timeout_s, bool curve) {
  for (int s : shards) Retire(s);  // the old server's channels
  std::vector<int> local, rest;
  for (int s : shards) (IsLocal(s) ? local : rest).push_back(s);
  if (lanes_wanted_) (void)AttachEach(local, timeout_s, &WorkerChannels::Lane, kNoLane, false);
  if (data_wanted_ && !curve) {
    for (int s : local)
      if (!channels_[static_cast<size_t>(s)]) rest.push_back(s);
    (void)AttachEach(rest, timeout_s, &WorkerChannels::Data, kNoDataChannel, false);
  }
}

WorkerChannel& WorkerChannels::ForPush(int s, const PushSource& v, int64_t whole, bool beside) {
  WorkerChannel* c = beside && v.keys.empty() && !v.encoded ? channels_[static_cast<size_t>(s)].get() : nullptr;
  return c && c->TakesPush(v.runs, whole) ? *c : *zmq_[static_cast<size_t>(s)];
}

WorkerChannel& WorkerChannels::ForPull(int s, std::span<const Segment> segments, int64_t whole, bool beside) {
  WorkerChannel* c = beside ? channels_[static_cast<size_t>(s)].get() : nullptr;
  return c && c->TakesPull(segments, whole) ? *c : *zmq_[static_cast<size_t>(s)];
}

void WorkerChannels::SendPush(int s, WorkerChannel& way, const PushSource& v, ValueRef* at, Payload* p) {
  if (Status st = way.SendPush(v, at, p); !st.ok()) {
    Drop(s, st);  // this push and the next go over ZeroMQ
    *at = ValueRef();
    (void)zmq_[static_cast<size_t>(s)]->SendPush(v, at, p);
  }
}

Result<bool> WorkerChannels::TakePull(int s, const Message& m, const PsReply& r, float* target) {
  WorkerChannel* c = Of(s, r.at.channel);
  // Values beside the message come with no frames of their own.
  if (r.at.outside() && (r.has_values || r.num_keys > 0 || (!c && r.at.channel == wire::CHANNEL_LANE))) {
    return DataLossError("unexpected pull reply through a value channel from " + NodeName(table_.servers(s)));
  }
  Status broke = c ? OkStatus() : UnavailableError("its value channel was dropped");
  if (c) RETURN_IF_ERROR(c->ReadPull(m, r, target, &broke));
  if (broke.ok()) return true;
  // The channel broke: the shard may be dying (then its death, once the scheduler declares it,
  // fails the request as any dead shard's does, and recovery takes over) or only the channel.
  // Either way the same pull goes again, over ZeroMQ.
  Drop(s, broke);
  return false;
}

void WorkerChannels::SkipPull(int s, const Message& m, const PsReply& r) {
  if (WorkerChannel* c = Of(s, r.at.channel)) {
    Status broke;
    if (Status st = c->ReadPull(m, r, nullptr, &broke); !st.ok() || !broke.ok()) Drop(s, st.ok() ? broke : st);
  }
}

WorkerChannel* WorkerChannels::Of(int s, wire::Channel kind) const {
  if (kind == wire::CHANNEL_ZMQ) return zmq_[static_cast<size_t>(s)].get();
  WorkerChannel* c = channels_[static_cast<size_t>(s)].get();
  return c && c->kind() == kind ? c : nullptr;
}

void WorkerChannels::Drop(int s, const Status& why) {
  if (!channels_[static_cast<size_t>(s)]) return;
  GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": value channel to " << NodeName(table_.servers(s))
                        << " dropped (values go over ZeroMQ from now on): " << why;
  Retire(s);
}

void WorkerChannels::Retire(int s) {
  auto& c = channels_[static_cast<size_t>(s)];
  if (!c) return;
  Add(c->bytes(), &retired_[static_cast<size_t>(c->kind())]);
  c.reset();
}

void WorkerChannels::Forget(int s, WorkerChannel::RequestId id) {
  if (auto& c = channels_[static_cast<size_t>(s)]) c->Forget(id);
}

void WorkerChannels::ForgetAll() {
  for (auto& c : channels_)
    if (c) c->ForgetAll();
}

int WorkerChannels::count(wire::Channel kind) const {
  return static_cast<int>(
      std::count_if(channels_.begin(), channels_.end(), [kind](const auto& c) { return c && c->kind() == kind; }));
}

ChannelBytes WorkerChannels::bytes(wire::Channel kind) const {
  ChannelBytes sum = retired_[static_cast<size_t>(kind)];
  for (const auto& c : channels_)
    if (c && c->kind() == kind) Add(c->bytes(), &sum);
  return sum;
}

ChannelBytes WorkerChannels::wire_bytes() const {
  ChannelBytes sum;
  for (const ChannelBytes& b : retired_) Add(b, &sum);
  for (const auto& c : channels_)
    if (c) Add(c->bytes(), &sum);
  return sum;
}

}  // namespace gradsync
