// PsClient: overlapped pushes in parts and a step's per-tensor pulls (ps_client.h).
#include <algorithm>

#include "common/obs/trace.h"
#include "worker/ps/ps_client.h"

namespace gradsync {

void PsClient::set_part_floats(size_t part_floats) {
  plan_.part_floats = std::max<size_t>(1, part_floats);
  plan_.parts.clear();
}

void PsClient::PlanParts() {
  plan_.parts.clear();
  plan_.of_tensor.assign(layout_.size(), {});
  plan_.per_shard.assign(static_cast<size_t>(table_.servers_size()), 0);
  for (size_t t = 0; t < layout_.size(); ++t) {
    const TensorInfo& ti = layout_[t];
    if (ti.sparse) continue;
    for (int s = 0; s < table_.servers_size(); ++s) {
      const auto [b, e] = Overlap(ti, partitioner_.range(s));
      // Equal pieces of at most part_floats elements.
      const int64_t len = e - b, step = static_cast<int64_t>(plan_.part_floats);
      if (len <= 0) continue;
      const int64_t pieces = (len + step - 1) / step;
      for (int64_t k = 0; k < pieces; ++k) {
        plan_.of_tensor[t].push_back(plan_.parts.size());
        plan_.parts.push_back({t, s, b + len * k / pieces, b + len * (k + 1) / pieces});
        plan_.per_shard[static_cast<size_t>(s)]++;
      }
    }
  }
}

PsClient::RequestId PsClient::BeginPush(int64_t clock, ConstFloatSpan grads, float lr) {
  if (plan_.parts.empty()) PlanParts();
  int shards = 0;
  for (int n : plan_.per_shard) shards += n > 0;
  open_ = OpenPush();
  open_.id = NewRequest(false, {}, shards);
  open_.clock = clock;
  open_.lr = lr;
  open_.grads = grads;
  for (const Shard& shard : shards_) open_.versions.push_back(shard.version);
  open_.sent.assign(plan_.parts.size(), false);
  open_.next.assign(plan_.per_shard.size(), 0);
  open_.way.assign(plan_.per_shard.size(), kUndecided);
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (plan_.per_shard[static_cast<size_t>(s)] > 0) pending_[open_.id].waiting.push_back(s);
  }
  return open_.id;
}

void PsClient::SendPart(size_t i, bool absent) {
  if (open_.sent[i]) return;
  open_.sent[i] = true;
  const Part& part = plan_.parts[i];
  const int s = part.shard;
  Shard& shard = shards_[static_cast<size_t>(s)];
  TraceSpan span("push", "comm", {{"shard", static_cast<double>(s)}, {"clock", static_cast<double>(open_.clock)},
                                  {"bytes", static_cast<double>(part.end - part.begin) * sizeof(float)}});
  PsRequest r = Request(wire::PUSH, open_.id, open_.clock);
  r.version = open_.versions[static_cast<size_t>(s)];
  r.lr = open_.lr;
  if (absent) r.absent_tensors = {static_cast<uint32_t>(part.tensor)};
  const int parts = plan_.per_shard[static_cast<size_t>(s)];
  if (parts > 1) {
    r.parts = parts;
    r.part = open_.next[static_cast<size_t>(s)]++;
    span.Arg("part", r.part);
  }
  r.segments = {{part.begin, part.end}};
  int& way = open_.way[static_cast<size_t>(s)];
  if (way == kUndecided) {
    // The push's first part to this shard decides: through its channel (once the channel has
    // room) or over ZeroMQ, for every part alike.
    way = kZmq;
    if (WorkerChannel* c = RawTo(s) ? channels_.ForPush(s, r.segments, shard.dense_floats) : nullptr) {
      if (Status st = c->OpenPush(wait_, [this, s] { return Progress(s); }); st.ok()) {
        way = kChannel;
      } else {
        FailShard(s, st.code() == StatusCode::kDeadlineExceeded ? st.WithContext(Name(s)) : st);
      }
    }
  }
  Payload p;
  WorkerChannel* channel = way == kChannel ? channels_.ForPush(s, r.segments, shard.dense_floats) : nullptr;
  if (channel) {
    if (Status st = channel->SendPush(r.segments, open_.grads, &r.at); !st.ok()) {
      channels_.Drop(s, st);  // this part and the rest go over ZeroMQ
      r.at = ValueRef();
      channel = nullptr;
    }
  }
  if (!channel) {
    p.has_values = true;
    p.values = open_.grads.subspan(static_cast<size_t>(part.begin), static_cast<size_t>(part.end - part.begin));
    p.lent = shard.lent;  // zero-copy: ZeroMQ reads the gradient buffer itself
  }
  span.End();
  Status st = sockets_[static_cast<size_t>(s)].Send("", EncodeRequest(r), p);
  if (!st.ok()) FailShard(s, st.WithContext("push to " + Name(s)));
}

void PsClient::PushReady(size_t tensor) {
  if (open_.id == 0 || tensor >= plan_.of_tensor.size()) return;
  for (size_t i : plan_.of_tensor[tensor]) SendPart(i);
}

PsClient::RequestId PsClient::FinishPush(std::span<const uint32_t> absent) {
  for (size_t i = 0; i < plan_.parts.size() && open_.id != 0; ++i) {
    SendPart(i, std::binary_search(absent.begin(), absent.end(), static_cast<uint32_t>(plan_.parts[i].tensor)));
  }
  const RequestId id = open_.id;
  open_ = OpenPush();
  return id;
}

std::vector<PsClient::RequestId> PsClient::PullTensors(int64_t clock, FloatSpan params) {
  if (plan_.parts.empty()) PlanParts();
  std::vector<RequestId> ids(layout_.size(), 0);
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (plan_.of_tensor[t].empty()) continue;
    ids[t] = NewRequest(true, params, static_cast<int>(plan_.of_tensor[t].size()));
    for (size_t i : plan_.of_tensor[t]) {
      const Part& part = plan_.parts[i];
      PsRequest r = Request(wire::PULL, ids[t], clock);
      r.segments = {{part.begin, part.end}};
      PullThrough(part.shard, ids[t], r, shards_[static_cast<size_t>(part.shard)].dense_floats);
      Send(part.shard, r, Payload(), "pull from");  // a shard answers each of its parts once
    }
  }
  return ids;
}

}  // namespace gradsync
