#include "worker/ps/client/ps_client.h"

#include <algorithm>

#include "common/net/security.h"
#include "common/obs/trace.h"

namespace gradsync {

PsClient::PsClient(TransportContext& ctx, const wire::ClusterTable& table, int rank, std::vector<TensorInfo> layout,
                   SchedulerClient* scheduler)
    : ctx_(ctx),
      layout_(std::move(layout)),
      partitioner_(LayoutSize(layout_), table.servers_size()),
      links_(ctx, table, rank, scheduler),
      channels_(rank, links_.table(), partitioner_,
                [this](int s, PsRequest r, double timeout_s) { return requests_.Ask(s, std::move(r), timeout_s); }),
      requests_(links_, channels_, codec_, partitioner_, rank),
      parts_(layout_, partitioner_, dense_floats_, links_, channels_, requests_),
      state_(layout_, partitioner_, links_, requests_) {
  for (int s = 0; s < table.servers_size(); ++s) {
    dense_runs_.push_back(DenseRuns(layout_, partitioner_.range(s)));
    dense_floats_.push_back(static_cast<int64_t>(TotalSize(dense_runs_.back())));
  }
}

Result<std::unique_ptr<PsClient>> PsClient::Create(TransportContext& ctx, const wire::ClusterTable& table, int rank,
                                                   std::vector<TensorInfo> layout, SchedulerClient* scheduler,
                                                   int64_t row_message_bytes) {
  if (table.servers_size() == 0) return InvalidArgumentError("the job has no servers");
  auto c = std::unique_ptr<PsClient>(new PsClient(ctx, table, rank, std::move(layout), scheduler));
  // The largest message either side sends (INIT and pull replies are a shard's whole range): the
  // shards' data sockets accept it before this worker connects, and its own sockets accept the
  // replies (ZMQ_MAXMSGSIZE on both sides).
  const int64_t max_message_bytes =
      std::max(MaxShardMessageBytes(c->layout_, table.servers_size()), row_message_bytes + 64);
  if (scheduler) RETURN_IF_ERROR(scheduler->AnnounceMessageLimit(max_message_bytes, 300.0));
  RETURN_IF_ERROR(c->links_.Connect(max_message_bytes));
  return c;
}

Status PsClient::SetCompression(const std::string& spec, uint64_t seed, bool error_feedback, float correction_momentum,
                                bool compress_pull) {
  return codec_.Set(spec, seed, error_feedback, correction_momentum, compress_pull, layout_, dense_floats_);
}

Status PsClient::Init(const wire::JobConfig& job, ConstFloatSpan params, double timeout_s) {
  RequestId id = requests_.New(false, {}, links_.size());
  for (int s = 0; s < links_.size(); ++s) {
    const Segment& range = partitioner_.range(s);
    PsRequest r = requests_.Request(wire::INIT, id, 0);
    r.job = job;
    r.segments = {range};
    Payload p;
    p.has_values = true;
    p.values = params.subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
    requests_.Expect(id, s);
    RETURN_IF_ERROR(links_.Send(s, r, p).WithContext("INIT to " + links_.Name(s)));
  }
  return requests_.Wait(id, timeout_s);
}

Result<PsClient::RequestId> PsClient::Push(int64_t clock, ConstFloatSpan grads, std::span<const uint64_t> keys,
                                           std::span<const float> values, float lr, std::span<const uint32_t> absent,
                                           std::span<const int> only, StepRows rows) {
  if (rows.plan != nullptr && (!keys.empty() || !codec_.raw())) {
    return InvalidArgumentError("a push with table rows carries neither sparse keys nor a codec");
  }
  auto key_parts = partitioner_.SplitSortedKeys(keys);
  auto wanted = [&](int s) { return only.empty() || std::find(only.begin(), only.end(), s) != only.end(); };
  int targets = 0;
  for (int s = 0; s < links_.size(); ++s) targets += wanted(s);
  RequestId id = requests_.New(false, {}, targets);
  size_t key_pos = 0;
  for (int s = 0; s < links_.size(); ++s) {
    const auto& ks = key_parts[static_cast<size_t>(s)];
    const size_t first = key_pos;
    key_pos += ks.size();
    if (!wanted(s)) continue;
    PsRequest r = requests_.Request(wire::PUSH, id, clock);
    r.push.version = links_.version(s);
    r.push.lr = lr;
    for (uint32_t t : absent) {
      const auto [b, e] = Overlap(layout_[t], partitioner_.range(s));
      if (b < e && !layout_[t].sparse) r.push.absent_tensors.push_back(t);
    }
    r.segments = dense_runs_[static_cast<size_t>(s)];
    const bool with_rows = rows.plan != nullptr && rows.plan->floats(s) > 0;
    if (with_rows) {
      r.parts = 2;
      r.part = 0;
    }
    RETURN_IF_ERROR(PushTo(s, id, r, grads, ks, values.subspan(first, ks.size())));
    if (with_rows) {
      // The rows, gathered into the frame ZeroMQ sends: the push's last part.
      PsRequest t = requests_.Request(wire::PUSH, id, clock);
      t.push.version = r.push.version;
      t.push.lr = lr;
      t.parts = 2;
      t.part = 1;
      t.tables.assign(rows.plan->runs(s).begin(), rows.plan->runs(s).end());
      Frame frame(static_cast<size_t>(rows.plan->floats(s)) * sizeof(float));
      rows.plan->Gather(s, rows.rows, static_cast<float*>(frame.data()));
      Payload p;
      p.has_values = true;
      p.keys = rows.plan->ids(s);
      p.values_frame = &frame;
      requests_.Post(s, t, p, "push to");
    }
  }
  return id;
}

Status PsClient::PushTo(int s, RequestId id, PsRequest& r, ConstFloatSpan grads, std::span<const uint64_t> keys,
                        std::span<const float> values) {
  TraceSpan span("push", "comm", {{"shard", static_cast<double>(s)}, {"clock", static_cast<double>(r.clock)}});
  Frame encoded;
  PushSource v{.runs = r.segments, .grads = grads, .keys = keys, .values = values};
  if (!codec_.raw()) {
    RETURN_IF_ERROR(codec_.Encode(s, r.segments, grads, r.clock, &encoded));
    r.codec = codec_.spec();
    v.encoded = &encoded;
  }
  WorkerChannel& way = channels_.ForPush(s, v, -1, requests_.RawTo(s));
  if (Status st = way.OpenPush(requests_.wait_policy(), [this, s] { return requests_.Progress(s); }); !st.ok()) {
    requests_.Expect(id, s);
    requests_.FailShard(s, st.code() == StatusCode::kDeadlineExceeded ? st.WithContext(links_.Name(s)) : st);
    return OkStatus();
  }
  Payload p;
  channels_.SendPush(s, way, v, &r.at, &p);
  span.Arg("bytes", v.bytes());
  span.End();
  requests_.Send(s, r, p, "push to");
  return OkStatus();
}

Result<PsClient::RequestId> PsClient::Pull(int64_t clock, FloatSpan params, std::span<const uint64_t> keys, bool full,
                                           StepRows rows) {
  auto key_parts = partitioner_.SplitSortedKeys(keys);
  int row_messages = 0;  // one more reply from each shard that holds some of the rows
  if (rows.plan != nullptr) {
    if (rows.rows.size() < rows.plan->floats()) return InvalidArgumentError("the rows' buffer is shorter than the step's rows");
    for (int s = 0; s < links_.size(); ++s) row_messages += rows.plan->floats(s) > 0;
  }
  // No parameter buffer: the rows alone (a request of no message when there are none either).
  const int dense_messages = params.empty() ? 0 : links_.size();
  RequestId id = requests_.New(true, params, dense_messages + row_messages);
  if (rows.plan != nullptr) {
    requests_.SetRows(id, rows);
    for (int s = 0; s < links_.size(); ++s) {
      if (rows.plan->floats(s) == 0) continue;
      PsRequest t = requests_.Request(wire::PULL, id, clock);
      t.tables.assign(rows.plan->runs(s).begin(), rows.plan->runs(s).end());
      Payload p;
      p.keys = rows.plan->ids(s);
      requests_.Send(s, t, p, "pull from");
    }
  }
  for (int s = 0; s < dense_messages; ++s) {
    PsRequest r = requests_.Request(wire::PULL, id, clock);
    Payload p;
    if (full) {
      r.segments = {partitioner_.range(s)};
    } else {
      r.segments = dense_runs_[static_cast<size_t>(s)];
      p.keys = key_parts[static_cast<size_t>(s)];
      if (codec_.compresses_pull()) r.codec = codec_.spec();  // a delta is welcome (the server decides)
    }
    if (p.keys.empty() && r.codec.empty()) requests_.PullThrough(s, id, r, -1);
    requests_.Send(s, r, p, "pull from");
  }
  return id;
}

Result<int> PsClient::AttachSharedMemory(double timeout_s) { return channels_.AttachLanes(timeout_s); }

Result<int> PsClient::AttachDataChannels(double timeout_s) {
  return channels_.AttachData(timeout_s, CurveEnabled(ctx_));
}

TrafficCounters PsClient::traffic() const {
  TrafficCounters t = links_.traffic();  // the replaced connections' included: counters never go back
  const ChannelBytes wire = channels_.wire_bytes();
  t.bytes_sent += wire.wire_sent;
  t.bytes_received += wire.wire_received;
  return t;
}

}  // namespace gradsync
