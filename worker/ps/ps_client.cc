#include "worker/ps/ps_client.h"

#include <algorithm>
#include <cstring>

#include "common/base/logging.h"
#include "common/net/control/node.h"
#include "common/net/security.h"
#include "common/obs/process_summary.h"
#include "common/obs/trace.h"

namespace gradsync {

PsClient::PsClient(TransportContext& ctx, const wire::ClusterTable& table, int rank, std::vector<TensorInfo> layout,
                   SchedulerClient* scheduler)
    : ctx_(ctx),
      table_(table),
      rank_(rank),
      layout_(std::move(layout)),
      partitioner_(LayoutSize(layout_), table.servers_size()),
      scheduler_(scheduler),
      shards_(static_cast<size_t>(table.servers_size())),
      channels_(rank, table_, partitioner_,
                [this](int s, PsRequest r, double timeout_s) { return Ask(s, std::move(r), timeout_s); }) {
  // News from before this client existed (e.g. a rejoining worker learns of dead nodes) counts.
  if (scheduler_) seen_.joined = scheduler_->news().joined_nodes().size();
  for (int s = 0; s < table.servers_size(); ++s) {
    Shard& shard = shards_[static_cast<size_t>(s)];
    shard.lent = std::make_shared<InflightCounter>();
    shard.dense_runs = DenseRuns(layout_, partitioner_.range(s));
    shard.dense_floats = static_cast<int64_t>(TotalSize(shard.dense_runs));
  }
}

Result<std::unique_ptr<PsClient>> PsClient::Create(TransportContext& ctx, const wire::ClusterTable& table, int rank,
                                                   std::vector<TensorInfo> layout, SchedulerClient* scheduler) {
  if (table.servers_size() == 0) return InvalidArgumentError("the job has no servers");
  auto c = std::unique_ptr<PsClient>(new PsClient(ctx, table, rank, std::move(layout), scheduler));
  // The largest message either side sends (INIT and pull replies are a shard's whole range): the
  // shards' data sockets accept it before this worker connects, and its own sockets accept the
  // replies (ZMQ_MAXMSGSIZE on both sides).
  c->max_message_bytes_ = MaxShardMessageBytes(c->layout_, table.servers_size());
  if (scheduler) RETURN_IF_ERROR(scheduler->AnnounceMessageLimit(c->max_message_bytes_, 300.0));
  for (int s = 0; s < table.servers_size(); ++s) {
    const wire::NodeInfo& info = table.servers(s);
    ASSIGN_OR_RETURN(Socket sock, Socket::ConnectDealer(ctx, "tcp://" + info.host() + ":" + std::to_string(info.port()),
                                                        NodeName(info), c->max_message_bytes_));
    c->sockets_.push_back(std::move(sock));
  }
  return c;
}

std::string PsClient::Name(int s) const { return NodeName(table_.servers(s)); }

PsClient::RequestId PsClient::NewRequest(bool is_pull, FloatSpan target, int parts) {
  RequestId id = next_id_++;
  Pending& p = pending_[id];
  p.remaining = parts;
  p.is_pull = is_pull;
  p.target = target;
  if (Trace::on()) p.sent_us = Trace::NowUs();
  return id;
}

PsRequest PsClient::Request(wire::Type type, RequestId id, int64_t clock) const {
  PsRequest r;
  r.type = type;
  r.worker = rank_;
  r.request_id = id;
  r.clock = clock;
  return r;
}

void PsClient::Send(int s, const PsRequest& r, const Payload& p, const char* what) {
  pending_[r.request_id].waiting.push_back(s);
  Status st = sockets_[static_cast<size_t>(s)].Send("", EncodeRequest(r), p);
  if (!st.ok()) FailShard(s, st.WithContext(std::string(what) + " " + Name(s)));
}

Status PsClient::SetCompression(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum,
                                bool compress_pull) {
  for (Shard& shard : shards_) shard.encoder.reset();
  codec_ = Codec();
  ASSIGN_OR_RETURN(auto probe, CreateCompressor(spec, seed));
  if (!probe) {
    if (error_feedback) return InvalidArgumentError("--error-feedback needs a --compress codec");
    if (compress_pull) return InvalidArgumentError("--compress-pull needs a --compress codec");
    return OkStatus();
  }
  for (const auto& t : layout_) {
    if (t.sparse) return InvalidArgumentError("--compress applies to dense models; " + t.name + " is sparse");
  }
  for (Shard& shard : shards_) {
    auto e = GradientEncoder::Create(spec, seed, static_cast<size_t>(shard.dense_floats), error_feedback,
                                     correction_momentum);
    if (!e.ok()) {
      for (Shard& other : shards_) other.encoder.reset();
      return e.status();
    }
    shard.encoder = std::move(e).value();
  }
  codec_.spec = spec;
  if (compress_pull) {
    ASSIGN_OR_RETURN(auto codec, CreateCompressor(spec, seed));  // as the server's (job.compress_pull)
    codec_.pull_decoder = std::make_unique<PullDeltaDecoder>(std::move(codec));
  }
  return OkStatus();
}

Status PsClient::Init(const wire::JobConfig& job, ConstFloatSpan params, double timeout_s) {
  RequestId id = NewRequest(false, {}, table_.servers_size());
  for (int s = 0; s < table_.servers_size(); ++s) {
    const Segment& range = partitioner_.range(s);
    PsRequest r = Request(wire::INIT, id, 0);
    r.job = job;
    r.segments = {range};
    Payload p;
    p.has_values = true;
    p.values = params.subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
    pending_[id].waiting.push_back(s);
    RETURN_IF_ERROR(sockets_[static_cast<size_t>(s)].Send("", EncodeRequest(r), p).WithContext("INIT to " + Name(s)));
  }
  return Wait(id, timeout_s);
}

bool PsClient::RawTo(int s) const { return codec_.spec.empty() && !shards_[static_cast<size_t>(s)].broken; }

Result<PsClient::RequestId> PsClient::Push(int64_t clock, ConstFloatSpan grads, std::span<const uint64_t> keys,
                                           std::span<const float> values, float lr, std::span<const uint32_t> absent,
                                           std::span<const int> only) {
  auto key_parts = partitioner_.SplitSortedKeys(keys);
  auto wanted = [&](int s) { return only.empty() || std::find(only.begin(), only.end(), s) != only.end(); };
  int targets = 0;
  for (int s = 0; s < table_.servers_size(); ++s) targets += wanted(s);
  RequestId id = NewRequest(false, {}, targets);
  size_t key_pos = 0;
  for (int s = 0; s < table_.servers_size(); ++s) {
    const auto& ks = key_parts[static_cast<size_t>(s)];
    const size_t first = key_pos;
    key_pos += ks.size();
    if (!wanted(s)) continue;
    PsRequest r = Request(wire::PUSH, id, clock);
    r.version = shards_[static_cast<size_t>(s)].version;
    r.lr = lr;
    for (uint32_t t : absent) {
      const auto [b, e] = Overlap(layout_[t], partitioner_.range(s));
      if (b < e && !layout_[t].sparse) r.absent_tensors.push_back(t);
    }
    r.segments = shards_[static_cast<size_t>(s)].dense_runs;
    RETURN_IF_ERROR(PushTo(s, id, r, grads, ks, values.subspan(first, ks.size())));
  }
  return id;
}

Status PsClient::EncodePush(int s, std::span<const Segment> runs, ConstFloatSpan grads, int64_t clock, Frame* frame) {
  // The shard's dense values, encoded (the codec sees one vector per shard and step).
  ConstFloatSpan dense;
  if (runs.size() == 1) {
    dense = grads.subspan(static_cast<size_t>(runs[0].begin), static_cast<size_t>(runs[0].size()));
  } else {
    scratch_.values.clear();
    for (const auto& run : runs) scratch_.values.insert(scratch_.values.end(), grads.begin() + run.begin, grads.begin() + run.end);
    dense = scratch_.values;
  }
  TraceSpan encode("encode", "comm", {{"shard", static_cast<double>(s)}, {"values", static_cast<double>(dense.size())}});
  encode.CountCpu();
  RETURN_IF_ERROR(shards_[static_cast<size_t>(s)].encoder->Encode(dense, static_cast<uint64_t>(clock), &codec_.encoded));
  encode.Arg("bytes", static_cast<double>(codec_.encoded.size()));
  *frame = Frame::Copy(codec_.encoded.data(), codec_.encoded.size());
  return OkStatus();
}

Status PsClient::PushTo(int s, RequestId id, PsRequest& r, ConstFloatSpan grads, std::span<const uint64_t> keys,
                        std::span<const float> values) {
  TraceSpan span("push", "comm", {{"shard", static_cast<double>(s)}, {"clock", static_cast<double>(r.clock)}});
  Shard& shard = shards_[static_cast<size_t>(s)];
  const auto& runs = r.segments;
  Payload p;
  p.has_values = true;
  Frame compressed;
  double bytes = static_cast<double>(TotalSize(runs)) * sizeof(float);
  WorkerChannel* channel = keys.empty() && RawTo(s) ? channels_.ForPush(s, runs, -1) : nullptr;
  if (channel) {
    // Through the channel: the values go there, the header alone over ZeroMQ.
    if (Status st = channel->OpenPush(wait_, [this, s] { return Progress(s); }); !st.ok()) {
      pending_[id].waiting.push_back(s);
      FailShard(s, st.code() == StatusCode::kDeadlineExceeded ? st.WithContext(Name(s)) : st);
      return OkStatus();
    }
    if (Status st = channel->SendPush(runs, grads, &r.at); !st.ok()) {
      channels_.Drop(s, st);  // this push and the next go over ZeroMQ
      r.at = ValueRef();
      channel = nullptr;
    } else {
      p = Payload();
    }
  }
  if (channel) {
    // Sent.
  } else if (!codec_.spec.empty()) {
    RETURN_IF_ERROR(EncodePush(s, runs, grads, r.clock, &compressed));
    bytes = static_cast<double>(compressed.size());
    r.codec = codec_.spec;
    p.values_frame = &compressed;
  } else if (runs.size() == 1 && keys.empty()) {
    p.values = grads.subspan(static_cast<size_t>(runs[0].begin), static_cast<size_t>(runs[0].size()));
    p.lent = shard.lent;  // zero-copy: ZeroMQ reads the gradient buffer itself
  } else {
    scratch_.values.clear();
    for (const auto& run : runs) scratch_.values.insert(scratch_.values.end(), grads.begin() + run.begin, grads.begin() + run.end);
    scratch_.values.insert(scratch_.values.end(), values.begin(), values.end());
    p.values = scratch_.values;  // copied by Send
    p.keys = keys;
    bytes = static_cast<double>(p.values.size() * sizeof(float) + p.keys.size() * sizeof(uint64_t));
  }
  span.Arg("bytes", bytes);
  span.End();
  Send(s, r, p, "push to");
  return OkStatus();
}

Result<PsClient::RequestId> PsClient::Pull(int64_t clock, FloatSpan params, std::span<const uint64_t> keys, bool full) {
  auto key_parts = partitioner_.SplitSortedKeys(keys);
  RequestId id = NewRequest(true, params, table_.servers_size());
  for (int s = 0; s < table_.servers_size(); ++s) {
    PsRequest r = Request(wire::PULL, id, clock);
    Payload p;
    if (full) {
      r.segments = {partitioner_.range(s)};
    } else {
      r.segments = shards_[static_cast<size_t>(s)].dense_runs;
      p.keys = key_parts[static_cast<size_t>(s)];
      if (codec_.pull_decoder) r.codec = codec_.spec;  // a delta is welcome (the server decides)
    }
    if (p.keys.empty() && r.codec.empty()) PullThrough(s, id, r, -1);
    Send(s, r, p, "pull from");
  }
  return id;
}

void PsClient::PullThrough(int s, RequestId id, PsRequest& r, int64_t whole) {
  // A job that compresses pulls wants none through a channel.
  if (!RawTo(s) || codec_.pull_decoder) return;
  if (WorkerChannel* channel = channels_.ForPull(s, r.segments, whole)) channel->SendPull(id, r.segments, &r.at);
}

Status PsClient::Progress(int s) {
  if (scheduler_) {
    RETURN_IF_ERROR(scheduler_->health());
    CheckMembership();
  }
  if (shards_[static_cast<size_t>(s)].broken) return UnavailableError(Name(s) + " is dead or restarted");
  return Receive(1);
}

void PsClient::Poll() { (void)Receive(0); }

bool PsClient::InFlight() const {
  for (const Shard& shard : shards_)
    if (shard.lent->count() > 0) return true;
  return std::any_of(pending_.begin(), pending_.end(),
                     [](const auto& p) { return p.second.is_pull && p.second.remaining > 0 && p.second.status.ok(); });
}

void PsClient::FailShard(int shard, const Status& s) {
  for (auto& [id, p] : pending_) {
    auto it = std::find(p.waiting.begin(), p.waiting.end(), shard);
    if (it == p.waiting.end()) continue;
    p.waiting.erase(it);
    p.remaining--;
    if (p.status.ok()) p.status = s;
  }
}

Result<int> PsClient::AttachSharedMemory(double timeout_s) { return channels_.AttachLanes(timeout_s); }

Result<int> PsClient::AttachDataChannels(double timeout_s) {
  return channels_.AttachData(timeout_s, CurveEnabled(ctx_));
}

double PsClient::last_version_lag() const {
  double most = -1;
  for (const Shard& s : shards_) most = std::max(most, s.version_lag);
  return most;
}
int64_t PsClient::last_clock_staleness() const {
  int64_t most = -1;
  for (const Shard& s : shards_) most = std::max(most, s.clock_staleness);
  return most;
}
double PsClient::last_wait_ms() const {
  double most = 0;
  for (const Shard& s : shards_) most = std::max(most, s.wait_ms);
  return most;
}

TrafficCounters PsClient::traffic() const {
  TrafficCounters t = retired_traffic_;  // connections replaced by Reconnect: counters never go back
  const ChannelBytes wire = channels_.wire_bytes();
  t.bytes_sent += wire.wire_sent;
  t.bytes_received += wire.wire_received;
  for (const Socket& s : sockets_) t += s.traffic();
  return t;
}

void SetReplyCounts(const PsClient::ReplyCounts& counts, summary::ProcessSummary* s) {
  s->set_pushes(counts.pushes);
  s->set_pulls(counts.pulls);
  SetHistogram(counts.version_lag, s->mutable_version_lag());
  SetHistogram(counts.clock_staleness, s->mutable_clock_staleness());
}

}  // namespace gradsync
