#include "worker/ps/client/part_plan.h"

#include <algorithm>

#include "common/obs/trace.h"

namespace gradsync {

void PartPlan::set_part_floats(size_t part_floats) {
  part_floats_ = std::max<size_t>(1, part_floats);
  parts_.clear();
}

void PartPlan::Plan() {
  parts_.clear();
  of_tensor_.assign(layout_.size(), {});
  per_shard_.assign(static_cast<size_t>(links_.size()), 0);
  for (size_t t = 0; t < layout_.size(); ++t) {
    const TensorInfo& ti = layout_[t];
    if (ti.sparse) continue;
    for (int s = 0; s < links_.size(); ++s) {
      const auto [b, e] = Overlap(ti, partitioner_.range(s));
      // Equal pieces of at most part_floats elements.
      const int64_t len = e - b, step = static_cast<int64_t>(part_floats_);
      if (len <= 0) continue;
      const int64_t pieces = (len + step - 1) / step;
      for (int64_t k = 0; k < pieces; ++k) {
        of_tensor_[t].push_back(parts_.size());
        parts_.push_back({t, s, b + len * k / pieces, b + len * (k + 1) / pieces});
        per_shard_[static_cast<size_t>(s)]++;
      }
    }
  }
}

PartPlan::RequestId PartPlan::BeginPush(int64_t clock, ConstFloatSpan grads, float lr) {
  if (parts_.empty()) Plan();
  int shards = 0;
  for (int n : per_shard_) shards += n > 0;
  open_ = OpenPush();
  open_.id = requests_.New(false, {}, shards);
  open_.clock = clock;
  open_.lr = lr;
  open_.grads = grads;
  for (int s = 0; s < links_.size(); ++s) open_.versions.push_back(links_.version(s));
  open_.sent.assign(parts_.size(), false);
  open_.next.assign(per_shard_.size(), 0);
  open_.opened.assign(per_shard_.size(), std::nullopt);
  for (int s = 0; s < links_.size(); ++s) {
    if (per_shard_[static_cast<size_t>(s)] > 0) requests_.Expect(open_.id, s);
  }
  return open_.id;
}

void PartPlan::SendPart(size_t i, bool absent) {
  if (open_.sent[i]) return;
  open_.sent[i] = true;
  const Part& part = parts_[i];
  const int s = part.shard;
  const int64_t whole = shard_floats_[static_cast<size_t>(s)];
  TraceSpan span("push", "comm", {{"shard", static_cast<double>(s)}, {"clock", static_cast<double>(open_.clock)},
                                  {"bytes", static_cast<double>(part.end - part.begin) * sizeof(float)}});
  PsRequest r = requests_.Request(wire::PUSH, open_.id, open_.clock);
  r.push.version = open_.versions[static_cast<size_t>(s)];
  r.push.lr = open_.lr;
  if (absent) r.push.absent_tensors = {static_cast<uint32_t>(part.tensor)};
  const int parts = per_shard_[static_cast<size_t>(s)];
  if (parts > 1) {
    r.parts = parts;
    r.part = open_.next[static_cast<size_t>(s)]++;
    span.Arg("part", r.part);
  }
  r.segments = {{part.begin, part.end}};
  const PushSource v{.runs = r.segments, .grads = open_.grads};
  std::optional<wire::Channel>& opened = open_.opened[static_cast<size_t>(s)];
  if (!opened) {
    // The push's first part to this shard decides: through its channel (once the channel has
    // room) or over ZeroMQ, for every part alike.
    WorkerChannel& c = channels_.ForPush(s, v, whole, requests_.RawTo(s));
    Status st = c.OpenPush(requests_.wait_policy(), [this, s] { return requests_.Progress(s); });
    opened = st.ok() ? c.kind() : wire::CHANNEL_ZMQ;
    if (!st.ok()) requests_.FailShard(s, st.code() == StatusCode::kDeadlineExceeded ? st.WithContext(links_.Name(s)) : st);
  }
  Payload p;
  // A channel that broke since: this part and the rest go over ZeroMQ.
  channels_.SendPush(s, channels_.ForPush(s, v, whole, *opened != wire::CHANNEL_ZMQ), v, &r.at, &p);
  span.End();
  requests_.Post(s, r, p, "push to");
}

void PartPlan::PushReady(size_t tensor) {
  if (open_.id == 0 || tensor >= of_tensor_.size()) return;
  for (size_t i : of_tensor_[tensor]) SendPart(i);
}

PartPlan::RequestId PartPlan::FinishPush(std::span<const uint32_t> absent) {
  for (size_t i = 0; i < parts_.size() && open_.id != 0; ++i) {
    SendPart(i, std::binary_search(absent.begin(), absent.end(), static_cast<uint32_t>(parts_[i].tensor)));
  }
  const RequestId id = open_.id;
  open_ = OpenPush();
  return id;
}

std::vector<PartPlan::RequestId> PartPlan::PullTensors(int64_t clock, FloatSpan params) {
  if (parts_.empty()) Plan();
  std::vector<RequestId> ids(layout_.size(), 0);
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (of_tensor_[t].empty()) continue;
    ids[t] = requests_.New(true, params, static_cast<int>(of_tensor_[t].size()));
    for (size_t i : of_tensor_[t]) {
      const Part& part = parts_[i];
      PsRequest r = requests_.Request(wire::PULL, ids[t], clock);
      r.segments = {{part.begin, part.end}};
      requests_.PullThrough(part.shard, ids[t], r, shard_floats_[static_cast<size_t>(part.shard)]);
      requests_.Send(part.shard, r, Payload(), "pull from");  // a shard answers each of its parts once
    }
  }
  return ids;
}

}  // namespace gradsync
