#include "worker/ps_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "common/cluster.h"
#include "common/logging.h"
#include "common/process_summary.h"
#include "common/security.h"
#include "common/trace.h"
#include "common/clock.h"

namespace gradsync {

PsClient::PsClient(TransportContext& ctx, const wire::ClusterTable& table, int rank, std::vector<TensorInfo> layout,
                   SchedulerClient* scheduler)
    : ctx_(ctx),
      table_(table),
      rank_(rank),
      layout_(std::move(layout)),
      partitioner_(LayoutSize(layout_), table.servers_size()),
      scheduler_(scheduler),
      versions_(static_cast<size_t>(table.servers_size()), 0),
      version_lag_(static_cast<size_t>(table.servers_size()), -1),
      wait_ms_(static_cast<size_t>(table.servers_size()), 0),
      clock_staleness_(static_cast<size_t>(table.servers_size()), -1) {
  broken_.assign(static_cast<size_t>(table.servers_size()), false);
  for (int i = 0; i < table.servers_size(); ++i) lent_.push_back(std::make_shared<InflightCounter>());
  join_clock_.assign(static_cast<size_t>(table.servers_size()), -1);
  // News from before this client existed (e.g. a rejoining worker learns of dead nodes) counts.
  if (scheduler_) seen_joined_ = scheduler_->joined_nodes().size();
  for (int s = 0; s < table.servers_size(); ++s) {
    dense_runs_.push_back(DenseRuns(layout_, partitioner_.range(s)));
    dense_floats_.push_back(static_cast<int64_t>(TotalSize(dense_runs_.back())));
  }
  lanes_.resize(static_cast<size_t>(table.servers_size()));
  data_.resize(static_cast<size_t>(table.servers_size()));
  data_port_.assign(static_cast<size_t>(table.servers_size()), 0);
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
  for (const auto& s : table.servers()) {
    ASSIGN_OR_RETURN(Socket sock, Socket::ConnectDealer(ctx,
                                                  "tcp://" + s.host() + ":" + std::to_string(s.port()),
                                                  NodeName(s), c->max_message_bytes_));
    c->sockets_.push_back(std::move(sock));
  }
  return c;
}

PsClient::RequestId PsClient::NewRequest(bool is_pull, FloatSpan target, int parts) {
  RequestId id = next_id_++;
  Pending& p = pending_[id];
  p.remaining = parts;
  p.is_pull = is_pull;
  p.target = target;
  if (Trace::on()) p.sent_us = Trace::NowUs();
  return id;
}

namespace {
// How long a push waits for a shard to release its lane's push area (bsp: until the round of the
// previous push is applied, which a normal step, pulling in between, never waits for).
constexpr int kLaneWaitSeconds = 600;
// How long a data-channel frame may stall (no byte moving) before the channel is dropped.
constexpr double kDataIdleSeconds = 60.0;
constexpr const char* kNoLane = " takes no shared-memory lane (values go over TCP): ";
constexpr const char* kNoDataChannel = " takes no data channel (values go over ZeroMQ): ";

// Shards with a lane (or channel): the non-null entries of a per-shard vector.
template <typename T>
int CountAttached(const std::vector<std::unique_ptr<T>>& per_shard) {
  return static_cast<int>(std::count_if(per_shard.begin(), per_shard.end(), [](const auto& p) { return p != nullptr; }));
}

PsRequest Request(wire::Type type, int rank, PsClient::RequestId id, int64_t clock) {
  PsRequest r;
  r.type = type;
  r.worker = rank;
  r.request_id = id;
  r.clock = clock;
  return r;
}
}  // namespace

Status PsClient::SetCompression(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum,
                                bool compress_pull) {
  encoders_.clear();
  codec_spec_.clear();
  pull_decoder_.reset();
  ASSIGN_OR_RETURN(auto probe, CreateCompressor(spec, seed));
  if (!probe) {
    if (error_feedback) return InvalidArgumentError("--error-feedback needs a --compress codec");
    if (compress_pull) return InvalidArgumentError("--compress-pull needs a --compress codec");
    return OkStatus();
  }
  for (const auto& t : layout_) {
    if (t.sparse) return InvalidArgumentError("--compress applies to dense models; " + t.name + " is sparse");
  }
  codec_spec_ = spec;
  if (compress_pull) {
    ASSIGN_OR_RETURN(auto codec, CreateCompressor(spec, seed));  // as the server's (job.compress_pull)
    pull_decoder_ = std::make_unique<PullDeltaDecoder>(std::move(codec));
  }
  for (int s = 0; s < table_.servers_size(); ++s) {
    auto e = GradientEncoder::Create(spec, seed, static_cast<size_t>(dense_floats_[static_cast<size_t>(s)]),
                                     error_feedback, correction_momentum);
    if (!e.ok()) {
      codec_spec_.clear();
      encoders_.clear();
      return e.status();
    }
    encoders_.push_back(std::move(e).value());
  }
  return OkStatus();
}

Status PsClient::Init(const wire::JobConfig& job, ConstFloatSpan params, double timeout_s) {
  RequestId id = NewRequest(false, {}, table_.servers_size());
  for (int s = 0; s < table_.servers_size(); ++s) {
    const Segment& range = partitioner_.range(s);
    PsRequest r = Request(wire::INIT, rank_, id, 0);
    r.job = job;
    r.segments = {range};
    Payload p;
    p.has_values = true;
    p.values = params.subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
    waiting_on_[id].push_back(s);
    RETURN_IF_ERROR(sockets_[s].Send("", EncodeRequest(r), p).WithContext("INIT to " + NodeName(table_.servers(s))));
  }
  return Wait(id, timeout_s);
}

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
    if (!wanted(s)) {
      key_pos += key_parts[s].size();
      continue;
    }
    TraceSpan span("push", "comm", {{"shard", static_cast<double>(s)}, {"clock", static_cast<double>(clock)}});
    PsRequest r = Request(wire::PUSH, rank_, id, clock);
    r.version = versions_[s];
    r.lr = lr;
    for (uint32_t t : absent) {
      const auto [b, e] = Overlap(layout_[t], partitioner_.range(s));
      if (b < e && !layout_[t].sparse) r.absent_tensors.push_back(t);
    }
    Payload p;
    p.has_values = true;
    const auto& runs = dense_runs_[s];
    const auto& ks = key_parts[s];
    r.segments = runs;
    Frame compressed;
    if (!codec_spec_.empty()) {
      // The shard's dense values, encoded (the codec sees one vector per shard and step).
      ConstFloatSpan dense;
      if (runs.size() == 1) {
        dense = grads.subspan(static_cast<size_t>(runs[0].begin), static_cast<size_t>(runs[0].size()));
      } else {
        scratch_.clear();
        for (const auto& run : runs) scratch_.insert(scratch_.end(), grads.begin() + run.begin, grads.begin() + run.end);
        dense = scratch_;
      }
      {
        TraceSpan encode("encode", "comm", {{"shard", static_cast<double>(s)}, {"values", static_cast<double>(dense.size())}});
        RETURN_IF_ERROR(encoders_[s]->Encode(dense, static_cast<uint64_t>(clock), &encoded_));
        encode.Arg("bytes", static_cast<double>(encoded_.size()));
      }
      compressed = Frame::Copy(encoded_.data(), encoded_.size());
      span.Arg("bytes", static_cast<double>(encoded_.size()));
      r.codec = codec_spec_;
      p.values_frame = &compressed;
    } else if (Lane* lane = ks.empty() ? LaneFor(s, runs, false) : nullptr) {
      // Through the lane: the gradient is copied into the push area once the shard is done with
      // the previous push there; the header alone goes over ZeroMQ.
      waiting_on_[id].push_back(s);
      key_pos += ks.size();
      if (Status st = WaitLaneFree(s); !st.ok()) {
        FailShard(s, st);
        continue;
      }
      float* area = lane->lane.push_area();
      const int64_t base = partitioner_.range(s).begin;
      for (const auto& run : runs) {
        std::memcpy(area + (run.begin - base), grads.data() + run.begin, static_cast<size_t>(run.size()) * sizeof(float));
        shm_pushed_ += static_cast<uint64_t>(run.size()) * sizeof(float);
      }
      r.shm = true;
      r.shm_seq = ++lane->sent;
      span.Arg("bytes", static_cast<double>(TotalSize(runs)) * sizeof(float));
      span.End();
      Status st = sockets_[s].Send("", EncodeRequest(r));
      if (!st.ok()) FailShard(s, st.WithContext("push to " + NodeName(table_.servers(s))));
      continue;
    } else if (ks.empty() && PushFrame(s, runs, grads, &r)) {
      // Over the data channel: the frame went first, the header follows.
      key_pos += ks.size();
      waiting_on_[id].push_back(s);
      span.Arg("bytes", static_cast<double>(TotalSize(runs)) * sizeof(float));
      span.End();
      Status st = sockets_[s].Send("", EncodeRequest(r));
      if (!st.ok()) FailShard(s, st.WithContext("push to " + NodeName(table_.servers(s))));
      continue;
    } else if (runs.size() == 1 && ks.empty()) {
      p.values = grads.subspan(static_cast<size_t>(runs[0].begin), static_cast<size_t>(runs[0].size()));
      p.lent = lent_[static_cast<size_t>(s)];  // zero-copy: ZeroMQ reads the gradient buffer itself
    } else {
      scratch_.clear();
      for (const auto& run : runs) scratch_.insert(scratch_.end(), grads.begin() + run.begin, grads.begin() + run.end);
      scratch_.insert(scratch_.end(), values.begin() + static_cast<std::ptrdiff_t>(key_pos),
                      values.begin() + static_cast<std::ptrdiff_t>(key_pos + ks.size()));
      p.values = scratch_;  // copied by Send
      p.keys = ks;
    }
    key_pos += ks.size();
    waiting_on_[id].push_back(s);
    if (p.values_frame == nullptr) span.Arg("bytes", static_cast<double>(p.values.size() * sizeof(float) + p.keys.size() * sizeof(uint64_t)));
    span.End();
    Status st = sockets_[s].Send("", EncodeRequest(r), p);
    if (!st.ok()) FailShard(s, st.WithContext("push to " + NodeName(table_.servers(s))));
  }
  return id;
}

Result<PsClient::RequestId> PsClient::Pull(int64_t clock, FloatSpan params, std::span<const uint64_t> keys, bool full) {
  auto key_parts = partitioner_.SplitSortedKeys(keys);
  RequestId id = NewRequest(true, params, table_.servers_size());
  for (int s = 0; s < table_.servers_size(); ++s) {
    PsRequest r = Request(wire::PULL, rank_, id, clock);
    Payload p;
    if (full) {
      r.segments = {partitioner_.range(s)};
    } else {
      r.segments = dense_runs_[s];
      p.keys = key_parts[s];
      if (pull_decoder_) r.codec = codec_spec_;  // a delta is welcome (the server decides)
    }
    if (p.keys.empty() && r.codec.empty()) {
      if (Lane* lane = LaneFor(s, r.segments, true)) {
        r.shm = true;
        for (const Segment& seg : r.segments) lane->pulls.push_back({id, seg});
      } else if (DataFor(s, r.segments) && !pull_decoder_) {
        r.data = true;
      }
    }
    waiting_on_[id].push_back(s);
    Status st = sockets_[s].Send("", EncodeRequest(r), p);
    if (!st.ok()) FailShard(s, st.WithContext("pull from " + NodeName(table_.servers(s))));
  }
  return id;
}

void PsClient::set_part_floats(size_t part_floats) {
  part_floats_ = std::max<size_t>(1, part_floats);
  parts_.clear();
}

void PsClient::PlanParts() {
  parts_.clear();
  parts_of_tensor_.assign(layout_.size(), {});
  parts_per_shard_.assign(static_cast<size_t>(table_.servers_size()), 0);
  for (size_t t = 0; t < layout_.size(); ++t) {
    const TensorInfo& ti = layout_[t];
    if (ti.sparse) continue;
    for (int s = 0; s < table_.servers_size(); ++s) {
      const Segment& r = partitioner_.range(s);
      const auto [b, e] = Overlap(ti, r);
      // Equal pieces of at most part_floats_ elements.
      const int64_t len = e - b, step = static_cast<int64_t>(part_floats_);
      if (len <= 0) continue;
      const int64_t pieces = (len + step - 1) / step;
      for (int64_t k = 0; k < pieces; ++k) {
        parts_of_tensor_[t].push_back(parts_.size());
        parts_.push_back({t, s, b + len * k / pieces, b + len * (k + 1) / pieces});
        parts_per_shard_[static_cast<size_t>(s)]++;
      }
    }
  }
}

PsClient::RequestId PsClient::BeginPush(int64_t clock, ConstFloatSpan grads, float lr) {
  if (parts_.empty()) PlanParts();
  int shards = 0;
  for (int n : parts_per_shard_) shards += n > 0;
  open_ = OpenPush();
  open_.id = NewRequest(false, {}, shards);
  open_.clock = clock;
  open_.lr = lr;
  open_.grads = grads;
  open_.versions = versions_;
  open_.sent.assign(parts_.size(), false);
  open_.next.assign(parts_per_shard_.size(), 0);
  open_.shm_seq.assign(parts_per_shard_.size(), 0);
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (parts_per_shard_[static_cast<size_t>(s)] > 0) waiting_on_[open_.id].push_back(s);
  }
  return open_.id;
}

void PsClient::SendPart(size_t i, bool absent) {
  if (open_.sent[i]) return;
  open_.sent[i] = true;
  const Part& part = parts_[i];
  const int s = part.shard;
  TraceSpan span("push", "comm", {{"shard", static_cast<double>(s)}, {"clock", static_cast<double>(open_.clock)},
                                  {"bytes", static_cast<double>(part.end - part.begin) * sizeof(float)}});
  PsRequest r = Request(wire::PUSH, rank_, open_.id, open_.clock);
  r.version = open_.versions[static_cast<size_t>(s)];
  r.lr = open_.lr;
  if (absent) r.absent_tensors = {static_cast<uint32_t>(part.tensor)};
  const int parts = parts_per_shard_[static_cast<size_t>(s)];
  if (parts > 1) {
    r.parts = parts;
    r.part = open_.next[static_cast<size_t>(s)]++;
    span.Arg("part", r.part);
  }
  r.segments = {{part.begin, part.end}};
  uint64_t& seq = open_.shm_seq[static_cast<size_t>(s)];
  if (seq == 0) {
    // The push's first part to this shard decides: through its lane (once the shard released the
    // push area) or over TCP, for every part alike.
    seq = kTcp;
    if (Lane* lane = LaneFor(s, r.segments, false)) {
      if (Status ws = WaitLaneFree(s); ws.ok()) {
        seq = ++lane->sent;
      } else {
        FailShard(s, ws);
      }
    }
  }
  Payload p;
  if (seq == kTcp && PushFrame(s, r.segments, open_.grads, &r, dense_floats_[static_cast<size_t>(s)])) {
    // Over the data channel, part by part: the frame went first, the header follows.
  } else if (seq != kTcp) {
    Lane& lane = *lanes_[static_cast<size_t>(s)];
    std::memcpy(lane.lane.push_area() + (part.begin - partitioner_.range(s).begin), open_.grads.data() + part.begin,
                static_cast<size_t>(part.end - part.begin) * sizeof(float));
    shm_pushed_ += static_cast<uint64_t>(part.end - part.begin) * sizeof(float);
    r.shm = true;
    r.shm_seq = seq;
  } else {
    p.has_values = true;
    p.values = open_.grads.subspan(static_cast<size_t>(part.begin), static_cast<size_t>(part.end - part.begin));
    p.lent = lent_[static_cast<size_t>(s)];  // zero-copy: ZeroMQ reads the gradient buffer itself
  }
  span.End();
  Status st = sockets_[s].Send("", EncodeRequest(r), p);
  if (!st.ok()) FailShard(s, st.WithContext("push to " + NodeName(table_.servers(s))));
}

void PsClient::PushReady(size_t tensor) {
  if (open_.id == 0 || tensor >= parts_of_tensor_.size()) return;
  for (size_t i : parts_of_tensor_[tensor]) SendPart(i);
}

PsClient::RequestId PsClient::FinishPush(std::span<const uint32_t> absent) {
  for (size_t i = 0; i < parts_.size() && open_.id != 0; ++i) {
    SendPart(i, std::binary_search(absent.begin(), absent.end(), static_cast<uint32_t>(parts_[i].tensor)));
  }
  const RequestId id = open_.id;
  open_ = OpenPush();
  return id;
}

std::vector<PsClient::RequestId> PsClient::PullTensors(int64_t clock, FloatSpan params) {
  if (parts_.empty()) PlanParts();
  std::vector<RequestId> ids(layout_.size(), 0);
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (parts_of_tensor_[t].empty()) continue;
    ids[t] = NewRequest(true, params, static_cast<int>(parts_of_tensor_[t].size()));
    for (size_t i : parts_of_tensor_[t]) {
      const Part& part = parts_[i];
      PsRequest r = Request(wire::PULL, rank_, ids[t], clock);
      r.segments = {{part.begin, part.end}};
      if (Lane* lane = LaneFor(part.shard, r.segments, true)) {
        r.shm = true;
        lane->pulls.push_back({ids[t], r.segments[0]});
      } else if (DataFor(part.shard, r.segments, dense_floats_[static_cast<size_t>(part.shard)]) && !pull_decoder_) {
        r.data = true;
      }
      waiting_on_[ids[t]].push_back(part.shard);  // a shard answers each of its parts once
      Status st = sockets_[part.shard].Send("", EncodeRequest(r), Payload());
      if (!st.ok()) FailShard(part.shard, st.WithContext("pull from " + NodeName(table_.servers(part.shard))));
    }
  }
  return ids;
}

void PsClient::Poll() { (void)Receive(0); }

bool PsClient::InFlight() const {
  for (const auto& l : lent_)
    if (l->count() > 0) return true;
  return std::any_of(pending_.begin(), pending_.end(),
                     [](const auto& p) { return p.second.is_pull && p.second.remaining > 0 && p.second.status.ok(); });
}

void PsClient::FailShard(int shard, const Status& s) {
  for (auto& [id, shards] : waiting_on_) {
    auto it = std::find(shards.begin(), shards.end(), shard);
    if (it == shards.end()) continue;
    shards.erase(it);
    Pending& p = pending_[id];
    p.remaining--;
    if (p.status.ok()) p.status = s;
  }
}

void PsClient::HandleReply(int shard, const Message& m) {
  bool frame_read = false;
  ApplyReply(shard, m, &frame_read);
  // A pull answered over the data channel: its frame is read (into the target, or past it when
  // the reply was not used) before anything else comes off that channel.
  if (!frame_read && m.malformed.ok() && m.header.type() == wire::PULL_REPLY && m.header.data() &&
      data_[static_cast<size_t>(shard)]) {
    if (Status st = ReadPullFrame(shard, m.header.data_seq(), {}, nullptr); !st.ok()) DropData(shard, st);
  }
}

void PsClient::ApplyReply(int shard, const Message& m, bool* frame_read) {
  const RequestId id = m.header.request_id();
  Lane* lane = lanes_[static_cast<size_t>(shard)].get();
  // A piece of a pull answered through the lane, more to come: its values are copied out, the
  // request stays open.
  const bool more = m.malformed.ok() &&
                    ((m.header.type() == wire::PULL_REPLY && m.header.shm() && m.header.parts() > 1 &&
                      m.header.part() >= 0 && m.header.part() + 1 < m.header.parts()) ||
                     // A state vector of a STATE_PULL's answer, more to come.
                     (m.header.type() == wire::STATE_PULL_REPLY && m.header.state_slot() >= 0 &&
                      m.header.state_slot() + 1 < m.header.state_slots()));
  auto it = pending_.find(id);
  auto wit = waiting_on_.find(id);
  auto sit = wit == waiting_on_.end() ? std::vector<int>::iterator()
                                      : std::find(wit->second.begin(), wit->second.end(), shard);
  const bool open = it != pending_.end() && wit != waiting_on_.end() && sit != wit->second.end();
  if (!more) {
    if (open) wit->second.erase(sit);
    // The shard writes no more of this request into the lane once it has answered every part.
    const bool answered = !open || std::find(wit->second.begin(), wit->second.end(), shard) == wit->second.end();
    if (lane && answered) {
      std::erase_if(lane->pulls, [id](const auto& e) { return e.first == id; });
    }
  }
  if (!open) return;  // a late reply to a failed request, or a duplicate
  Pending& p = it->second;
  if (!more) p.remaining--;
  auto fail = [&](Status s) {
    if (p.status.ok()) p.status = std::move(s);
  };
  if (!m.malformed.ok()) {
    fail(DataLossError("malformed reply from " + NodeName(table_.servers(shard)) + ": " + m.malformed.message()));
    return;
  }
  auto decoded = DecodeReply(m.header);
  if (!decoded.ok()) {
    fail(DataLossError("malformed reply from " + NodeName(table_.servers(shard)) + ": " + decoded.status().message()));
    return;
  }
  const PsReply& r = *decoded;
  switch (r.type) {
    case wire::ERROR: fail(r.error); return;
    case wire::PUSH_REPLY:
      version_lag_[shard] = static_cast<double>(r.version_lag);
      ++counts_.pushes;
      ++counts_.version_lag[r.version_lag];
      return;
    case wire::JOIN_REPLY: join_clock_[shard] = r.clock; versions_[shard] = r.version; return;
    case wire::DATA_ATTACH_REPLY: data_port_[static_cast<size_t>(shard)] = r.data_port; return;
    case wire::STATE_PULL_REPLY:
      if (Status st = TakeStateReply(shard, m, r, p); !st.ok()) fail(st);
      return;
    case wire::PULL_REPLY: break;
    default: return;
  }
  if (!p.is_pull) return;
  // Write the reply's values where its segments and keys say, after checking they fit.
  const Segment& range = partitioner_.range(shard);
  const int64_t n = static_cast<int64_t>(p.target.size());
  for (const Segment& seg : r.segments) {
    if (seg.begin < range.begin || seg.end < seg.begin || seg.end > range.end || seg.end > n) {
      fail(DataLossError("pull reply from " + NodeName(table_.servers(shard)) + " is out of range"));
      return;
    }
  }
  if (!r.codec.empty()) {
    // A compressed delta since the last pull: decoded (and so validated) whole, then added.
    if (!pull_decoder_ || r.codec != codec_spec_ || m.header.num_keys() > 0) {
      fail(DataLossError("unexpected compressed pull reply ('" + r.codec + "') from " + NodeName(table_.servers(shard))));
      return;
    }
    TraceSpan decode("decode", "comm", {{"shard", static_cast<double>(shard)}, {"bytes", static_cast<double>(m.values.size())}});
    if (Status st = pull_decoder_->AddTo(m.values.bytes(), r.segments, r.clock, p.target); !st.ok()) {
      fail(st.WithContext("pull reply from " + NodeName(table_.servers(shard))));
      return;
    }
  } else if (r.data) {
    *frame_read = true;
    if (m.header.has_values() || m.header.num_keys() > 0) {
      fail(DataLossError("unexpected data-channel pull reply from " + NodeName(table_.servers(shard))));
      return;
    }
    Status st = data_[static_cast<size_t>(shard)]
                    ? ReadPullFrame(shard, r.data_seq, r.segments, p.target.data())
                    : UnavailableError("its data channel was dropped");
    if (!st.ok()) {
      // The channel broke: the shard may be dying (then its death, once the scheduler declares
      // it, fails the request as any dead shard's does, and recovery takes over) or only the
      // channel. Either way the same pull goes again, over ZeroMQ.
      DropData(shard, st);
      PsRequest again = Request(wire::PULL, rank_, id, r.clock);
      again.segments = r.segments;
      if (Status sent = sockets_[shard].Send("", EncodeRequest(again)); !sent.ok()) {
        fail(sent.WithContext("pull from " + NodeName(table_.servers(shard))));
        return;
      }
      p.remaining++;
      wit->second.push_back(shard);
      return;
    }
  } else if (r.shm) {
    if (!lane || m.header.has_values() || m.header.num_keys() > 0) {
      fail(DataLossError("unexpected shared-memory pull reply from " + NodeName(table_.servers(shard))));
      return;
    }
    const float* area = lane->lane.pull_area();
    for (const Segment& seg : r.segments) {
      std::memcpy(p.target.data() + seg.begin, area + (seg.begin - range.begin),
                  static_cast<size_t>(seg.size()) * sizeof(float));
      shm_pulled_ += static_cast<uint64_t>(seg.size()) * sizeof(float);
    }
  } else {
    size_t pos = 0;
    for (const Segment& seg : r.segments) {
      m.CopyValues(p.target.data() + seg.begin, pos, static_cast<size_t>(seg.size()));
      pos += static_cast<size_t>(seg.size());
    }
    const auto keys = m.Keys(&key_scratch_);
    value_scratch_.resize(keys.size());
    m.CopyValues(value_scratch_.data(), pos, keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] < static_cast<uint64_t>(range.begin) || keys[i] >= static_cast<uint64_t>(range.end)) {
        fail(DataLossError("pull reply key out of range"));
        return;
      }
      p.target[keys[i]] = value_scratch_[i];
    }
  }
  versions_[shard] = r.version;
  wait_ms_[shard] = r.wait_ms;
  clock_staleness_[shard] = r.clock_staleness;
  if (!more) {
    ++counts_.pulls;
    ++counts_.clock_staleness[r.clock_staleness];
  }
  if (p.sent_us >= 0 && !more && Trace::on()) {
    // From the request to this shard's (last) reply: the wait, the shard's work, the transfer.
    const double values = static_cast<double>(TotalSize(r.segments) + m.header.num_keys());
    Trace::Complete("pull", "comm", p.sent_us, Trace::NowUs() - p.sent_us,
                    {{"shard", static_cast<double>(shard)}, {"clock", static_cast<double>(r.clock)},
                     {"bytes", r.codec.empty() ? values * sizeof(float) : static_cast<double>(m.values.size())},
                     {"held ms", r.wait_ms}});
  }
}

Status PsClient::TakeStateReply(int shard, const Message& m, const PsReply& r, Pending& p) {
  const std::string who = NodeName(table_.servers(shard));
  if (!p.state) return DataLossError("an optimizer state from " + who + " that was not asked for");
  StateGather::Shard& got = p.state->shards[static_cast<size_t>(shard)];
  const Segment& range = partitioner_.range(shard);
  const size_t n = static_cast<size_t>(range.size());
  const bool same = got.received == 0 || (r.optimizer == got.kind && r.steps == got.steps && r.skipped == got.skipped &&
                                           r.state_slots == got.slots);
  const bool fits = r.state_slots > 0 ? r.segments.size() == 1 && r.segments[0] == range && m.num_values() == n &&
                                            m.header.num_keys() == 0
                                      : !m.header.has_values() && m.header.num_keys() == 0;
  if (r.state_slot != got.received || !same || !fits) {
    return DataLossError("optimizer state vector " + std::to_string(r.state_slot) + " of " +
                         std::to_string(r.state_slots) + " from " + who + " is not the one due or not its range");
  }
  if (got.received == 0) {
    got.kind = r.optimizer;
    got.steps = r.steps;
    got.skipped = r.skipped;
    got.slots = r.state_slots;
    got.values.assign(static_cast<size_t>(r.state_slots) * n, 0.0f);
  }
  if (r.state_slots > 0) m.CopyValues(got.values.data() + static_cast<size_t>(r.state_slot) * n);
  got.received++;
  return OkStatus();
}

Result<OptimizerStateParts> PsClient::PullOptimizerState(int64_t clock, double timeout_s, const std::string& kind) {
  const int servers = table_.servers_size();
  auto gather = std::make_shared<StateGather>();
  gather->shards.resize(static_cast<size_t>(servers));
  const RequestId id = NewRequest(false, {}, servers);
  pending_[id].state = gather;
  for (int s = 0; s < servers; ++s) {
    PsRequest r = Request(wire::STATE_PULL, rank_, id, clock);
    r.segments = {partitioner_.range(s)};
    r.optimizer = kind;
    waiting_on_[id].push_back(s);
    Status st = sockets_[s].Send("", EncodeRequest(r));
    if (!st.ok()) FailShard(s, st.WithContext("optimizer state from " + NodeName(table_.servers(s))));
  }
  RETURN_IF_ERROR(Wait(id, timeout_s).WithContext("reading the optimizer state"));
  // Every shard's answer is whole (its request closed with its last vector); they must agree.
  const StateGather::Shard& first = gather->shards[0];
  for (int s = 1; s < servers; ++s) {
    const StateGather::Shard& other = gather->shards[static_cast<size_t>(s)];
    if (other.kind != first.kind || other.slots != first.slots) {
      return FailedPreconditionError("the shards' optimizers differ: " + NodeName(table_.servers(0)) + "'s is " +
                                     first.kind + " with " + std::to_string(first.slots) + " state vector(s), " +
                                     NodeName(table_.servers(s)) + "'s " + other.kind + " with " +
                                     std::to_string(other.slots));
    }
    if (other.steps != first.steps) {
      return FailedPreconditionError(
          "the shards are at different optimizer steps (" + NodeName(table_.servers(0)) + ": " +
          std::to_string(first.steps) + ", " + NodeName(table_.servers(s)) + ": " + std::to_string(other.steps) +
          "): another worker's push was applied on some shards only; read the state where no push is in flight");
    }
  }
  OptimizerStateParts out;
  out.kind = first.kind;
  out.steps = first.steps;
  // Each tensor's own steps from the shards' per-layer counts (a tensor that crosses shards
  // skipped the same steps on each; the first shard's piece says).
  for (int s = servers - 1; s >= 0; --s) {
    RETURN_IF_ERROR(TensorSteps(layout_, partitioner_.range(s), out.steps,
                                gather->shards[static_cast<size_t>(s)].skipped, &out.tensor_steps)
                        .WithContext(NodeName(table_.servers(s))));
  }
  out.slots.resize(static_cast<size_t>(first.slots));
  for (size_t k = 0; k < out.slots.size(); ++k) {
    auto& tensors = out.slots[k];
    tensors.reserve(layout_.size());
    for (const TensorInfo& t : layout_) {
      std::vector<float> v(static_cast<size_t>(t.size));
      // The tensor's pieces, from every shard whose range it crosses.
      for (int s = 0; s < servers; ++s) {
        const Segment& range = partitioner_.range(s);
        const auto [b, e] = Overlap(t, range);
        if (b >= e) continue;
        const float* src = gather->shards[static_cast<size_t>(s)].values.data() +
                           k * static_cast<size_t>(range.size()) + static_cast<size_t>(b - range.begin);
        std::copy(src, src + (e - b), v.begin() + (b - t.offset));
      }
      tensors.push_back(std::move(v));
    }
  }
  return out;
}

Status PsClient::PushOptimizerState(int64_t clock, const OptimizerStateParts& state, double timeout_s) {
  if (state.steps < 0 || state.steps > kMaxOptimizerSteps) {
    return InvalidArgumentError("optimizer steps " + std::to_string(state.steps) + " out of range");
  }
  const int slots = static_cast<int>(state.slots.size());
  if (slots > kMaxOptimizerSlots) {
    return InvalidArgumentError("an optimizer state of " + std::to_string(slots) + " vectors (at most " +
                                std::to_string(kMaxOptimizerSlots) + ")");
  }
  ASSIGN_OR_RETURN(const OptimizerKind kind, ParseOptimizerKind(state.kind));
  if (!state.tensor_steps.empty() && state.tensor_steps.size() != layout_.size()) {
    return InvalidArgumentError("steps for " + std::to_string(state.tensor_steps.size()) + " tensors; the model has " +
                                std::to_string(layout_.size()));
  }
  for (size_t t = 0; t < state.tensor_steps.size(); ++t) {
    if (state.tensor_steps[t] < 0 || state.tensor_steps[t] > state.steps) {
      return InvalidArgumentError("tensor '" + layout_[t].name + "': " + std::to_string(state.tensor_steps[t]) +
                                  " steps taken, not in [0, " + std::to_string(state.steps) + "]");
    }
  }
  for (int k = 0; k < slots; ++k) {
    const auto& tensors = state.slots[static_cast<size_t>(k)];
    if (tensors.size() != layout_.size()) {
      return InvalidArgumentError("optimizer state vector " + std::to_string(k) + " has " +
                                  std::to_string(tensors.size()) + " tensors; the model has " +
                                  std::to_string(layout_.size()));
    }
    for (size_t t = 0; t < layout_.size(); ++t) {
      if (static_cast<int64_t>(tensors[t].size()) != layout_[t].size) {
        return InvalidArgumentError("optimizer state vector " + std::to_string(k) + ", tensor '" + layout_[t].name +
                                    "': " + std::to_string(tensors[t].size()) + " values, the tensor has " +
                                    std::to_string(layout_[t].size));
      }
      // What a shard would refuse, refused here: no shard sets part of a state another refuses.
      RETURN_IF_ERROR(CheckOptimizerSlot(kind, k, tensors[t]).WithContext("tensor '" + layout_[t].name + "'"));
    }
  }
  const int servers = table_.servers_size();
  const int messages = std::max(1, slots);
  const RequestId id = NewRequest(false, {}, servers * messages);
  std::vector<float> vector;
  for (int s = 0; s < servers; ++s) {
    const Segment& range = partitioner_.range(s);
    const std::vector<int64_t> skipped = SkippedSteps(layout_, range, state.steps, state.tensor_steps);
    for (int k = 0; k < messages; ++k) {
      PsRequest r = Request(wire::STATE_PUSH, rank_, id, clock);
      r.optimizer = state.kind;
      r.steps = state.steps;
      r.skipped = skipped;
      r.state_slots = slots;
      r.state_slot = k;
      Payload p;
      if (slots > 0) {
        // The shard's range of vector k, from the tensors it crosses (copied by Send).
        vector.assign(static_cast<size_t>(range.size()), 0.0f);
        for (size_t t = 0; t < layout_.size(); ++t) {
          const TensorInfo& ti = layout_[t];
          const auto [b, e] = Overlap(ti, range);
          if (b >= e) continue;
          const auto& src = state.slots[static_cast<size_t>(k)][t];
          std::copy(src.begin() + (b - ti.offset), src.begin() + (e - ti.offset), vector.begin() + (b - range.begin));
        }
        r.segments = {range};
        p.has_values = true;
        p.values = vector;
      }
      waiting_on_[id].push_back(s);  // a shard answers each of its messages once
      Status st = sockets_[s].Send("", EncodeRequest(r), p);
      if (!st.ok()) FailShard(s, st.WithContext("optimizer state to " + NodeName(table_.servers(s))));
    }
  }
  return Wait(id, timeout_s).WithContext("setting the optimizer state");
}

Status PsClient::Receive(int timeout_ms, RequestId until) {
  // One shard: ZeroMQ's blocking receive waits for its replies (one system call to sleep in,
  // where a poll and then a receive take several). Several: a poll says which have some.
  std::vector<size_t> ready = {0};
  int wait_ms = timeout_ms;
  if (sockets_.size() != 1) {
    ASSIGN_OR_RETURN(ready, PollReadable(sockets_, timeout_ms));
    wait_ms = 0;
  }
  for (size_t s : ready) {
    for (int k = 0; k < 64; ++k) {
      auto m = sockets_[s].Recv(k == 0 ? wait_ms : 0);
      if (!m.ok()) {
        // The wait itself failing is the error a failed poll was (other receive errors end the batch).
        if (k == 0 && wait_ms > 0 && m.status().code() != StatusCode::kDeadlineExceeded) return m.status();
        break;
      }
      HandleReply(static_cast<int>(s), *m);
      // The awaited request is done: back to the caller now, not after one more (empty) receive.
      if (until != 0) {
        auto it = pending_.find(until);
        if (it == pending_.end() || it->second.remaining <= 0 || !it->second.status.ok()) return OkStatus();
      }
    }
  }
  return OkStatus();
}

Status PsClient::Wait(RequestId id, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return InvalidArgumentError("unknown request id " + std::to_string(id));
    // Done when every shard answered, or at the first failure (the others' replies are dropped).
    if (it->second.remaining <= 0 || !it->second.status.ok()) {
      Status s = it->second.status;
      const bool is_pull = it->second.is_pull;
      pending_.erase(it);
      waiting_on_.erase(id);
      // A push's lent gradient frames must be released before the caller may overwrite them.
      if (!is_pull && s.ok()) WaitForLentFrames();  // on failure the buffer is not reused
      return s;
    }
    // Dead or restarted shards, or a lost scheduler, end the wait at once.
    if (scheduler_) {
      if (Status h = scheduler_->health(); !h.ok()) return h;
      CheckMembership();
      for (int s : waiting_on_[id]) {
        if (broken_[s]) FailShard(s, UnavailableError(NodeName(table_.servers(s)) + " is dead or restarted"));
      }
      if (pending_[id].remaining <= 0 || !pending_[id].status.ok()) continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      std::string who;
      for (int s : waiting_on_[id]) who += (who.empty() ? "" : ", ") + NodeName(table_.servers(s));
      return DeadlineExceededError("no reply from " + who + " within " + SecondsText(timeout_s) + " s");
    }
    RETURN_IF_ERROR(Receive(static_cast<int>(std::min<int64_t>(left, 20)), id));
  }
}

void PsClient::WaitForLentFrames() {
  for (size_t s = 0; s < lent_.size(); ++s) {
    // A dead shard's connection may hold frames of an earlier, failed push until Reconnect
    // replaces it: they are not waited for (that buffer's next contents never reach it).
    while (lent_[s]->count() > 0) {
      CheckMembership();
      if (broken_[s]) break;
      std::this_thread::yield();
    }
  }
}

void PsClient::CheckMembership() {
  if (!scheduler_ || scheduler_->events() == seen_events_) return;
  seen_events_ = scheduler_->events();
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (scheduler_->IsDead(wire::SERVER, s)) broken_[s] = true;
  }
  const auto joined = scheduler_->joined_nodes();
  for (; seen_joined_ < joined.size(); ++seen_joined_) {
    const auto& n = joined[seen_joined_];
    if (n.role() != wire::SERVER || n.rank() < 0 || n.rank() >= table_.servers_size()) continue;
    // A restart this client has not reconnected to yet (Reconnect may already have used the
    // scheduler's newer table: then the address is the one it is connected to).
    const auto& mine = table_.servers(n.rank());
    if (n.host() != mine.host() || n.port() != mine.port()) broken_[n.rank()] = true;
  }
}

std::vector<int> PsClient::shards_to_reconnect() const {
  std::vector<int> out;
  for (int s = 0; s < table_.servers_size(); ++s)
    if (broken_[s]) out.push_back(s);
  return out;
}

Status PsClient::Reconnect(double timeout_s) {
  if (!scheduler_) return FailedPreconditionError("no scheduler to learn the shards' new addresses from");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  CheckMembership();
  const std::vector<int> reconnected = shards_to_reconnect();
  for (int s : reconnected) {
    while (scheduler_->IsDead(wire::SERVER, s)) {
      if (Status h = scheduler_->health(); !h.ok()) return h;
      if (std::chrono::steady_clock::now() > deadline) {
        return UnavailableError(NodeName(table_.servers(s)) + " did not come back within " + SecondsText(timeout_s) + " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const wire::NodeInfo info = scheduler_->table().servers(s);
    ASSIGN_OR_RETURN(Socket sock, Socket::ConnectDealer(ctx_,
                                                  "tcp://" + info.host() + ":" + std::to_string(info.port()), NodeName(info),
                                                  max_message_bytes_));
    // The old connection and whatever it still held are dropped; its bytes still count.
    retired_traffic_.bytes_sent += sockets_[s].traffic().bytes_sent;
    retired_traffic_.bytes_received += sockets_[s].traffic().bytes_received;
    retired_traffic_.messages_sent += sockets_[s].traffic().messages_sent;
    retired_traffic_.messages_received += sockets_[s].traffic().messages_received;
    retired_traffic_.malformed_received += sockets_[s].traffic().malformed_received;
    sockets_[s] = std::move(sock);
    *table_.mutable_servers(s) = info;
    broken_[s] = false;
    versions_[s] = 0;
    lanes_[static_cast<size_t>(s)].reset();  // the old server's lane; a new one below
    RetireData(s);  // the old server's channel; a new one below
    GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": reconnected to " << NodeName(info) << " at " << info.host() << ":"
                          << info.port();
  }
  // Every outstanding request is void now (the caller redoes its step).
  pending_.clear();
  waiting_on_.clear();
  for (auto& lane : lanes_)
    if (lane) lane->pulls.clear();
  auto left = [&] {
    return std::max(1.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
  };
  std::vector<int> local, rest;
  for (int s : reconnected) (IsLocal(table_.servers(s)) ? local : rest).push_back(s);
  if (shm_wanted_) (void)AttachEach(local, left, &PsClient::AttachLane, kNoLane, false);
  if (data_wanted_ && !CurveEnabled(ctx_)) {
    for (int s : local)
      if (!lanes_[static_cast<size_t>(s)]) rest.push_back(s);
    (void)AttachEach(rest, left, &PsClient::AttachData, kNoDataChannel, false);
  }
  return OkStatus();
}

bool PsClient::IsLocal(const wire::NodeInfo& server) const {
  const std::string& h = server.host();
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0) return true;
  for (const auto& w : table_.workers())
    if (w.rank() == rank_) return !w.host().empty() && w.host() == h;
  return false;
}

Status PsClient::AttachLane(int s, double timeout_s) {
  const Segment& range = partitioner_.range(s);
  if (range.size() <= 0) return FailedPreconditionError("an empty range");
  ASSIGN_OR_RETURN(ShmLane lane, ShmLane::Create(range.size()));
  PsRequest r = Request(wire::SHM_ATTACH, rank_, 0, 0);
  r.request_id = NewRequest(false, {}, 1);
  r.segments = {range};
  r.shm_name = lane.name();
  waiting_on_[r.request_id].push_back(s);
  Status st = sockets_[s].Send("", EncodeRequest(r));
  if (!st.ok()) FailShard(s, st);
  st = Wait(r.request_id, timeout_s);
  lane.Unpublish();  // mapped on both sides (or refused): no one else can map it
  if (!st.ok()) return st;
  auto l = std::make_unique<Lane>();
  l->lane = std::move(lane);
  lanes_[static_cast<size_t>(s)] = std::move(l);
  return OkStatus();
}

Status PsClient::AttachEach(std::span<const int> shards, const std::function<double()>& timeout_s,
                            Status (PsClient::*attach)(int, double), const char* refused, bool strict) {
  for (int s : shards) {
    if (Status st = (this->*attach)(s, timeout_s()); !st.ok()) {
      if (strict && (st.code() == StatusCode::kDeadlineExceeded || st.code() == StatusCode::kUnauthenticated)) return st;
      GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": " << NodeName(table_.servers(s)) << refused << st;
    }
  }
  return OkStatus();
}

Result<int> PsClient::AttachSharedMemory(double timeout_s) {
  shm_wanted_ = true;
  std::vector<int> shards;
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (!lanes_[static_cast<size_t>(s)] && IsLocal(table_.servers(s))) shards.push_back(s);
  }
  RETURN_IF_ERROR(AttachEach(shards, [&] { return timeout_s; }, &PsClient::AttachLane, kNoLane, true));
  return shm_lanes();
}

int PsClient::shm_lanes() const { return CountAttached(lanes_); }

PsClient::Lane* PsClient::LaneFor(int s, std::span<const Segment> segments, bool is_pull) {
  Lane* lane = lanes_[static_cast<size_t>(s)].get();
  if (!lane || !codec_spec_.empty() || segments.empty() || broken_[static_cast<size_t>(s)]) return nullptr;
  if (is_pull) {
    if (pull_decoder_) return nullptr;  // the job compresses pulls: the shard wants no lane pulls
    // Never two answers in flight for the same elements: the second would overwrite the first
    // while it is being read. Such a pull goes over TCP instead.
    for (const auto& [id, seg] : lane->pulls)
      for (const Segment& want : segments)
        if (want.begin < seg.end && seg.begin < want.end) return nullptr;
  } else {
    for (size_t i = 1; i < segments.size(); ++i)
      if (segments[i].begin != segments[i - 1].end) return nullptr;  // a push's segments must be contiguous
  }
  return lane;
}

Status PsClient::WaitLaneFree(int s) {
  Lane& lane = *lanes_[static_cast<size_t>(s)];
  if (lane.lane.consumed() >= lane.sent) return OkStatus();
  for (int spin = 0; spin < 256; ++spin) {
    std::this_thread::yield();
    if (lane.lane.consumed() >= lane.sent) return OkStatus();
  }
  // The shard holds the previous push (bsp: until its round is applied). Replies are handled
  // meanwhile, and a dead shard ends the wait.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kLaneWaitSeconds);
  while (lane.lane.consumed() < lane.sent) {
    if (scheduler_) {
      RETURN_IF_ERROR(scheduler_->health());
      CheckMembership();
    }
    if (broken_[static_cast<size_t>(s)]) return UnavailableError(NodeName(table_.servers(s)) + " is dead or restarted");
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError(NodeName(table_.servers(s)) + " has not released its shared-memory push area in " +
                                   std::to_string(kLaneWaitSeconds) + " s");
    }
    RETURN_IF_ERROR(Receive(1));
  }
  return OkStatus();
}

Status PsClient::AttachData(int s, double timeout_s) {
  const Segment& range = partitioner_.range(s);
  if (range.size() <= 0) return FailedPreconditionError("an empty range");
  std::string token(kDataTokenBytes, '\0');
  std::random_device rd;
  for (char& c : token) c = static_cast<char>(rd() & 0xff);
  PsRequest r = Request(wire::DATA_ATTACH, rank_, 0, 0);
  r.request_id = NewRequest(false, {}, 1);
  r.segments = {range};
  r.data_token = token;
  data_port_[static_cast<size_t>(s)] = 0;
  waiting_on_[r.request_id].push_back(s);
  Status st = sockets_[s].Send("", EncodeRequest(r));
  if (!st.ok()) FailShard(s, st);
  RETURN_IF_ERROR(Wait(r.request_id, timeout_s));
  const int port = data_port_[static_cast<size_t>(s)];
  if (port <= 0) return DataLossError("DATA_ATTACH_REPLY without a port");
  const std::string& host = table_.servers(s).host();
  ASSIGN_OR_RETURN(DataStream stream, DataStream::Connect(host, port, std::min(timeout_s, 30.0)));
  RETURN_IF_ERROR(stream.Write(std::vector<iovec>{{token.data(), token.size()}}, 5.0));
  char ack[kDataAckBytes];
  if (Status a = stream.Read(ack, sizeof(ack), 5.0); !a.ok() || std::memcmp(ack, kDataAck, kDataAckBytes) != 0) {
    return UnavailableError("data channel to " + host + ":" + std::to_string(port) + " was not accepted" +
                            (a.ok() ? std::string(" (a wrong acknowledgement)") : ": " + a.message()));
  }
  auto link = std::make_unique<DataLink>();
  link->stream = std::move(stream);
  data_[static_cast<size_t>(s)] = std::move(link);
  return OkStatus();
}

Result<int> PsClient::AttachDataChannels(double timeout_s) {
  data_wanted_ = true;
  if (CurveEnabled(ctx_)) return 0;  // CURVE: values stay encrypted on ZeroMQ
  std::vector<int> shards;
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (!lanes_[static_cast<size_t>(s)] && !data_[static_cast<size_t>(s)]) shards.push_back(s);
  }
  RETURN_IF_ERROR(AttachEach(shards, [&] { return timeout_s; }, &PsClient::AttachData, kNoDataChannel, true));
  return data_channels();
}

int PsClient::data_channels() const { return CountAttached(data_); }

PsClient::DataLink* PsClient::DataFor(int s, std::span<const Segment> segments, int64_t whole) {
  DataLink* link = data_[static_cast<size_t>(s)].get();
  if (!link || !codec_spec_.empty() || segments.empty() || broken_[static_cast<size_t>(s)]) return nullptr;
  if (static_cast<size_t>(whole >= 0 ? whole : TotalSize(segments)) < data_min_floats_) return nullptr;
  return link;
}

bool PsClient::PushFrame(int s, std::span<const Segment> runs, ConstFloatSpan grads, PsRequest* r, int64_t whole) {
  DataLink* link = DataFor(s, runs, whole);
  if (!link) return false;
  for (size_t i = 1; i < runs.size(); ++i)
    if (runs[i].begin != runs[i - 1].end) return false;  // a push's segments must be contiguous
  std::vector<std::span<const float>> values;
  for (const Segment& run : runs) {
    values.push_back(grads.subspan(static_cast<size_t>(run.begin), static_cast<size_t>(run.size())));
  }
  const uint64_t seq = link->sent + 1;
  if (Status st = link->stream.WriteFrame(seq, values, kDataIdleSeconds); !st.ok()) {
    DropData(s, st);  // this push and the next go over ZeroMQ
    return false;
  }
  link->sent = seq;
  data_pushed_ += static_cast<uint64_t>(TotalSize(runs)) * sizeof(float);
  r->data = true;
  r->data_seq = seq;
  return true;
}

Status PsClient::ReadPullFrame(int s, uint64_t seq, std::span<const Segment> segments, float* target) {
  DataLink* link = data_[static_cast<size_t>(s)].get();
  if (!link) return FailedPreconditionError("no data channel to " + NodeName(table_.servers(s)));
  const uint64_t most = static_cast<uint64_t>(partitioner_.range(s).size()) * sizeof(float);
  while (true) {
    ASSIGN_OR_RETURN(DataFrameHead head, link->stream.ReadHead(kDataIdleSeconds));
    if (head.bytes > most) {
      return DataLossError("a data frame of " + std::to_string(head.bytes) + " bytes from " +
                           NodeName(table_.servers(s)) + " (its range holds " + std::to_string(most) + ")");
    }
    if (head.seq < seq) {  // its header never arrived
      RETURN_IF_ERROR(link->stream.Discard(head.bytes, kDataIdleSeconds));
      continue;
    }
    if (head.seq > seq) {
      return DataLossError("data frame " + std::to_string(head.seq) + " from " + NodeName(table_.servers(s)) +
                           " where " + std::to_string(seq) + " was due");
    }
    if (target == nullptr) return link->stream.Discard(head.bytes, kDataIdleSeconds);
    if (head.bytes != static_cast<uint64_t>(TotalSize(segments)) * sizeof(float)) {
      RETURN_IF_ERROR(link->stream.Discard(head.bytes, kDataIdleSeconds));
      return DataLossError("data frame " + std::to_string(seq) + " from " + NodeName(table_.servers(s)) + " holds " +
                           std::to_string(head.bytes) + " bytes; the reply's segments need " +
                           std::to_string(TotalSize(segments) * 4));
    }
    for (const Segment& seg : segments) {
      RETURN_IF_ERROR(link->stream.Read(target + seg.begin, static_cast<size_t>(seg.size()) * sizeof(float),
                                        kDataIdleSeconds));
    }
    data_pulled_ += head.bytes;
    return OkStatus();
  }
}

void PsClient::DropData(int s, const Status& why) {
  if (!data_[static_cast<size_t>(s)]) return;
  GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": data channel to " << NodeName(table_.servers(s))
                        << " dropped (values go over ZeroMQ from now on): " << why;
  RetireData(s);
}

void PsClient::RetireData(int s) {
  auto& link = data_[static_cast<size_t>(s)];
  if (!link) return;
  retired_traffic_.bytes_sent += link->stream.bytes_written();
  retired_traffic_.bytes_received += link->stream.bytes_read();
  link.reset();
}

Result<int64_t> PsClient::Join(const std::vector<int>& shards, int64_t clock, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<int> todo = shards;
  int64_t best = -1;
  while (!todo.empty()) {
    RequestId id = NewRequest(false, {}, static_cast<int>(todo.size()));
    for (int s : todo) {
      waiting_on_[id].push_back(s);
      join_clock_[s] = -1;
      Status st = sockets_[s].Send("", EncodeRequest(Request(wire::JOIN, rank_, id, clock)));
      if (!st.ok()) FailShard(s, st);
    }
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    Status st = Wait(id, std::max(0.05, left));
    std::vector<int> again;
    for (int s : todo) {
      if (join_clock_[s] >= 0) best = std::max(best, join_clock_[s]);
      else again.push_back(s);
    }
    if (again.empty()) break;
    // Not ready yet (the shard has not heard of this worker's rejoin, or is not initialized).
    if (!st.ok() && st.code() != StatusCode::kUnavailable) return st.WithContext("JOIN");
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError("JOIN: " + std::to_string(again.size()) + " shard(s) did not take this worker back within " +
                                   SecondsText(timeout_s) + " s" + (st.ok() ? "" : ": " + st.message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    todo = again;
  }
  return best;
}

double PsClient::last_version_lag() const { return *std::max_element(version_lag_.begin(), version_lag_.end()); }
int64_t PsClient::last_clock_staleness() const {
  return *std::max_element(clock_staleness_.begin(), clock_staleness_.end());
}
double PsClient::last_wait_ms() const { return *std::max_element(wait_ms_.begin(), wait_ms_.end()); }

TrafficCounters PsClient::traffic() const {
  TrafficCounters t = retired_traffic_;  // connections replaced by Reconnect: counters never go back
  for (const auto& d : data_) {
    if (!d) continue;
    t.bytes_sent += d->stream.bytes_written();
    t.bytes_received += d->stream.bytes_read();
  }
  for (const auto& s : sockets_) {
    t.bytes_sent += s.traffic().bytes_sent;
    t.bytes_received += s.traffic().bytes_received;
    t.messages_sent += s.traffic().messages_sent;
    t.messages_received += s.traffic().messages_received;
    t.malformed_received += s.traffic().malformed_received;
  }
  return t;
}

void SetReplyCounts(const PsClient::ReplyCounts& counts, summary::ProcessSummary* s) {
  s->set_pushes(counts.pushes);
  s->set_pulls(counts.pulls);
  SetHistogram(counts.version_lag, s->mutable_version_lag());
  SetHistogram(counts.clock_staleness, s->mutable_clock_staleness());
}

}  // namespace gradsync
