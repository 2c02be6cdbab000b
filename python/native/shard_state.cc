#include "python/native/shard_state.h"

#include <algorithm>

#include "common/config/train_config.h"
#include "python/native/frontend.h"  // StatusError, ThrowIfError

namespace gradsync::python {

FrontendShardState::FrontendShardState(PsClient* client, const PsSyncBase* sync, const Model* model,
                                       OptimizerOptions optimizer, double timeout_s)
    : client_(client), sync_(sync), model_(model), optimizer_(std::move(optimizer)), timeout_s_(timeout_s) {}

NamedOptimizerState FrontendShardState::Read() {
  auto parts = client_->state().PullOptimizerState(sync_->clock(), timeout_s_, OptimizerKindName(optimizer_.kind));
  ThrowIfError(parts.status());
  NamedOptimizerState out;
  out.kind = parts->kind;
  if (parts->steps == 0) return out;  // no step taken: torch's state is empty then
  out.step = parts->steps;
  out.tensor_steps = std::move(parts->tensor_steps);
  const std::vector<std::string> names = OptimizerSlotNames(optimizer_);
  if (names.size() != parts->slots.size()) {
    throw StatusError(DataLossError("the shards keep " + std::to_string(parts->slots.size()) +
                                    " optimizer state vector(s); this job's optimizer keeps " +
                                    std::to_string(names.size())));
  }
  for (size_t k = 0; k < names.size(); ++k) out.slots[names[k]] = std::move(parts->slots[k]);
  return out;
}

void FrontendShardState::SetOptimizerState(NamedOptimizerState state) {
  const std::string kind = OptimizerKindName(optimizer_.kind);
  if (state.kind != kind) {
    throw StatusError(InvalidArgumentError("the optimizer state is " + state.kind + "'s; this job's optimizer is " + kind));
  }
  const std::vector<std::string> names = OptimizerSlotNames(optimizer_);
  std::string keeps;
  for (const auto& n : names) keeps += (keeps.empty() ? "'" : ", '") + n + "'";
  keeps = kind + (optimizer_.kind == OptimizerKind::kSgd ? " with momentum " + ShortestText(optimizer_.momentum) : "") +
          " keeps " + (keeps.empty() ? std::string("no state vectors") : keeps);
  const auto& layout = model_->layout();
  OptimizerStateParts parts;
  parts.kind = kind;
  if (state.slots.empty()) {
    // No vectors: the state of no step taken (zeros), or plain SGD's step count alone.
    if (!names.empty() && state.step.value_or(0) != 0) {
      throw StatusError(InvalidArgumentError("a step count without the state vectors (" + keeps +
                                             "): give both, or neither (no step taken)"));
    }
    if (state.step.value_or(0) < 0) throw StatusError(InvalidArgumentError("'step' must be >= 0"));
    parts.steps = state.step.value_or(0);
    for (size_t k = 0; k < names.size(); ++k) {
      auto& tensors = parts.slots.emplace_back();
      for (const auto& t : layout) tensors.emplace_back(static_cast<size_t>(t.size), 0.0f);
    }
  } else {
    for (const auto& [name, tensors] : state.slots) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        throw StatusError(InvalidArgumentError("unknown optimizer state vector '" + name + "': " + keeps));
      }
    }
    for (const auto& name : names) {
      auto it = state.slots.find(name);
      if (it == state.slots.end()) throw StatusError(InvalidArgumentError("optimizer state vector '" + name + "' is missing: " + keeps));
      if (it->second.size() != layout.size()) {
        throw StatusError(InvalidArgumentError("optimizer state vector '" + name + "' has " +
                                               std::to_string(it->second.size()) + " tensors; the model has " +
                                               std::to_string(layout.size())));
      }
      for (size_t t = 0; t < layout.size(); ++t) {
        if (static_cast<int64_t>(it->second[t].size()) != layout[t].size) {
          throw StatusError(InvalidArgumentError("optimizer state vector '" + name + "', tensor '" + layout[t].name +
                                                 "': " + std::to_string(it->second[t].size()) +
                                                 " values, the tensor has " + std::to_string(layout[t].size)));
        }
      }
      parts.slots.push_back(std::move(it->second));
    }
    if (!state.step) {
      // Adam's step count drives its bias correction: it goes with its vectors. SGD's counts only.
      if (optimizer_.kind != OptimizerKind::kSgd) {
        throw StatusError(InvalidArgumentError("'step' is missing: " + kind + "'s state has its step count"));
      }
      state.step = 1;
    }
    if (*state.step < 1) {
      throw StatusError(InvalidArgumentError("'step' must be >= 1 with state vectors (0: no step taken, and no vectors)"));
    }
    parts.steps = *state.step;
  }
  parts.tensor_steps = std::move(state.tensor_steps);
  ThrowIfError(client_->state().PushOptimizerState(sync_->clock(), parts, timeout_s_));
}

void FrontendShardState::SetParameters() {
  ThrowIfError(client_->state().PushParameters(sync_->clock(), model_->params(), timeout_s_));
}

}  // namespace gradsync::python
