#include "worker/ps/client/state_transfer.h"

#include <algorithm>
#include <cmath>

#include "common/optim/optimizer.h"

namespace gradsync {

Status StateGather::Take(int shard, const Message& m, const PsReply& r, const Segment& range, const std::string& who) {
  Shard& got = shards_[static_cast<size_t>(shard)];
  const size_t n = static_cast<size_t>(range.size());
  const bool same = got.received == 0 || (r.state.optimizer == got.kind && r.state.steps == got.steps && r.state.skipped == got.skipped &&
                                           r.state.slots == got.slots);
  const bool fits = r.state.slots > 0 ? r.segments.size() == 1 && r.segments[0] == range && m.num_values() == n &&
                                            r.num_keys == 0
                                      : !r.has_values && r.num_keys == 0;
  if (r.state.slot != got.received || !same || !fits) {
    return DataLossError("optimizer state vector " + std::to_string(r.state.slot) + " of " +
                         std::to_string(r.state.slots) + " from " + who + " is not the one due or not its range");
  }
  if (got.received == 0) {
    got.kind = r.state.optimizer;
    got.steps = r.state.steps;
    got.skipped = r.state.skipped;
    got.slots = r.state.slots;
    got.values.assign(static_cast<size_t>(r.state.slots) * n, 0.0f);
  }
  if (r.state.slots > 0) m.CopyValues(got.values.data() + static_cast<size_t>(r.state.slot) * n);
  got.received++;
  return OkStatus();
}

Result<OptimizerStateParts> StateTransfer::PullOptimizerState(int64_t clock, double timeout_s, const std::string& kind) {
  const int servers = links_.size();
  auto gather = std::make_shared<StateGather>(servers);
  const PsRequests::RequestId id = requests_.New(false, {}, servers, gather);
  for (int s = 0; s < servers; ++s) {
    PsRequest r = requests_.Request(wire::STATE_PULL, id, clock);
    r.segments = {partitioner_.range(s)};
    r.state.optimizer = kind;
    requests_.Send(s, r, Payload(), "optimizer state from");
  }
  RETURN_IF_ERROR(requests_.Wait(id, timeout_s).WithContext("reading the optimizer state"));
  // Every shard's answer is whole (its request closed with its last vector); they must agree.
  const StateGather::Shard& first = gather->shard(0);
  for (int s = 1; s < servers; ++s) {
    const StateGather::Shard& other = gather->shard(s);
    if (other.kind != first.kind || other.slots != first.slots) {
      return FailedPreconditionError("the shards' optimizers differ: " + links_.Name(0) + "'s is " +
                                     first.kind + " with " + std::to_string(first.slots) + " state vector(s), " +
                                     links_.Name(s) + "'s " + other.kind + " with " +
                                     std::to_string(other.slots));
    }
    if (other.steps != first.steps) {
      return FailedPreconditionError(
          "the shards are at different optimizer steps (" + links_.Name(0) + ": " +
          std::to_string(first.steps) + ", " + links_.Name(s) + ": " + std::to_string(other.steps) +
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
                                gather->shard(s).skipped, &out.tensor_steps)
                        .WithContext(links_.Name(s)));
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
        const float* src = gather->shard(s).values.data() +
                           k * static_cast<size_t>(range.size()) + static_cast<size_t>(b - range.begin);
        std::copy(src, src + (e - b), v.begin() + (b - t.offset));
      }
      tensors.push_back(std::move(v));
    }
  }
  return out;
}

namespace {
// What PushOptimizerState refuses before sending anything: a state that does not fit `layout`,
// or holds a value a shard would refuse.
Status CheckStateFits(const OptimizerStateParts& state, const std::vector<TensorInfo>& layout) {
  if (state.steps < 0 || state.steps > kMaxOptimizerSteps) {
    return InvalidArgumentError("optimizer steps " + std::to_string(state.steps) + " out of range");
  }
  const int slots = static_cast<int>(state.slots.size());
  if (slots > kMaxOptimizerSlots) {
    return InvalidArgumentError("an optimizer state of " + std::to_string(slots) + " vectors (at most " +
                                std::to_string(kMaxOptimizerSlots) + ")");
  }
  ASSIGN_OR_RETURN(const OptimizerKind kind, ParseOptimizerKind(state.kind));
  if (!state.tensor_steps.empty() && state.tensor_steps.size() != layout.size()) {
    return InvalidArgumentError("steps for " + std::to_string(state.tensor_steps.size()) + " tensors; the model has " +
                                std::to_string(layout.size()));
  }
  for (size_t t = 0; t < state.tensor_steps.size(); ++t) {
    if (state.tensor_steps[t] < 0 || state.tensor_steps[t] > state.steps) {
      return InvalidArgumentError("tensor '" + layout[t].name + "': " + std::to_string(state.tensor_steps[t]) +
                                  " steps taken, not in [0, " + std::to_string(state.steps) + "]");
    }
  }
  for (int k = 0; k < slots; ++k) {
    const auto& tensors = state.slots[static_cast<size_t>(k)];
    if (tensors.size() != layout.size()) {
      return InvalidArgumentError("optimizer state vector " + std::to_string(k) + " has " +
                                  std::to_string(tensors.size()) + " tensors; the model has " +
                                  std::to_string(layout.size()));
    }
    for (size_t t = 0; t < layout.size(); ++t) {
      if (static_cast<int64_t>(tensors[t].size()) != layout[t].size) {
        return InvalidArgumentError("optimizer state vector " + std::to_string(k) + ", tensor '" + layout[t].name +
                                    "': " + std::to_string(tensors[t].size()) + " values, the tensor has " +
                                    std::to_string(layout[t].size));
      }
      // What a shard would refuse, refused here: no shard sets part of a state another refuses.
      RETURN_IF_ERROR(CheckOptimizerSlot(kind, k, tensors[t]).WithContext("tensor '" + layout[t].name + "'"));
    }
  }
  return OkStatus();
}
}  // namespace

Status StateTransfer::PushOptimizerState(int64_t clock, const OptimizerStateParts& state, double timeout_s) {
  RETURN_IF_ERROR(CheckStateFits(state, layout_));
  const int slots = static_cast<int>(state.slots.size());
  const int servers = links_.size();
  const int messages = std::max(1, slots);
  const PsRequests::RequestId id = requests_.New(false, {}, servers * messages);
  std::vector<float> vector;
  for (int s = 0; s < servers; ++s) {
    const Segment& range = partitioner_.range(s);
    const std::vector<int64_t> skipped = SkippedSteps(layout_, range, state.steps, state.tensor_steps);
    for (int k = 0; k < messages; ++k) {
      PsRequest r = requests_.Request(wire::STATE_PUSH, id, clock);
      r.state.optimizer = state.kind;
      r.state.steps = state.steps;
      r.state.skipped = skipped;
      r.state.slots = slots;
      r.state.slot = k;
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
      requests_.Send(s, r, p, "optimizer state to");  // a shard answers each of its messages once
    }
  }
  return requests_.Wait(id, timeout_s).WithContext("setting the optimizer state");
}

Status StateTransfer::PushParameters(int64_t clock, ConstFloatSpan params, double timeout_s) {
  const int64_t total = LayoutSize(layout_);
  if (static_cast<int64_t>(params.size()) != total) {
    return InvalidArgumentError("a parameter set of " + std::to_string(params.size()) + " values; the model has " +
                                std::to_string(total));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!std::isfinite(params[i])) {
      return InvalidArgumentError("parameter " + std::to_string(i) + " of the set is not finite");
    }
  }
  const int servers = links_.size();
  const PsRequests::RequestId id = requests_.New(false, {}, servers);
  for (int s = 0; s < servers; ++s) {
    const Segment& range = partitioner_.range(s);
    PsRequest r = requests_.Request(wire::STATE_PUSH, id, clock);
    r.state.params = true;
    r.segments = {range};
    Payload p;
    p.has_values = true;
    p.values = params.subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
    requests_.Send(s, r, p, "parameters to");
  }
  return requests_.Wait(id, timeout_s).WithContext("setting the parameters");
}

}  // namespace gradsync
