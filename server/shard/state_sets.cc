#include "server/shard/state_sets.h"

#include <algorithm>

#include "common/optim/optimizer.h"

namespace gradsync {

Result<const StateSets::Set*> StateSets::Add(const PsRequest& r, const std::string& peer, const CopyValues& copy,
                                             const KvShard& shard) {
  const int w = r.worker;
  auto refuse = [&](Status s) {
    sets_.erase(w);  // a bad vector drops the whole set: nothing of it is applied
    return s;
  };
  const size_t n = static_cast<size_t>(shard.range().size());
  if (r.state.params) {
    // The parameters, in one message; any set this worker had open is replaced.
    Set fresh;
    fresh.peer = peer;
    fresh.first = r;
    fresh.params = true;
    fresh.state.assign(n, 0.0f);
    copy(fresh.state.data());
    if (Status s = shard.CheckParams(fresh.state); !s.ok()) return refuse(s);
    fresh.next = 1;
    fresh.complete = true;
    return &(sets_[w] = std::move(fresh));
  }
  const OptimizerKind kind = shard.optimizer().options().kind;
  const int slots = shard.optimizer().num_slots();
  if (r.state.slots != slots) {
    std::string names;
    for (const auto& name : OptimizerSlotNames(shard.optimizer().options())) names += (names.empty() ? "" : ", ") + name;
    return refuse(InvalidArgumentError("an optimizer state of " + std::to_string(r.state.slots) +
                                       " vector(s); this shard's " + OptimizerKindName(kind) + " keeps " +
                                       std::to_string(slots) + (names.empty() ? "" : " (" + names + ")")));
  }
  Set* set = nullptr;
  if (r.state.slot == 0) {
    Set fresh;
    fresh.peer = peer;
    fresh.first = r;
    fresh.state.assign(static_cast<size_t>(slots) * n, 0.0f);
    set = &(sets_[w] = std::move(fresh));
  } else {
    auto it = sets_.find(w);
    if (it == sets_.end() || it->second.complete || it->second.params || it->second.next != r.state.slot ||
        it->second.first.request_id != r.request_id || it->second.first.clock != r.clock ||
        it->second.first.state.steps != r.state.steps || it->second.first.state.skipped != r.state.skipped ||
        it->second.first.state.optimizer != r.state.optimizer) {
      return refuse(InvalidArgumentError("optimizer state vector " + std::to_string(r.state.slot) + " of " +
                                         std::to_string(slots) +
                                         " is not the next of the set this worker sends (vectors 0, 1, ... of one "
                                         "request, in order)"));
    }
    set = &it->second;
  }
  if (slots > 0) {
    float* dst = set->state.data() + static_cast<size_t>(r.state.slot) * n;
    copy(dst);
    if (Status s = CheckOptimizerSlot(kind, r.state.slot, {dst, n}); !s.ok()) return refuse(s);
  }
  set->next = r.state.slot + 1;
  set->complete = set->next >= std::max(1, slots);
  return set;
}

std::optional<StateSets::Set> StateSets::Take(int worker) {
  auto it = sets_.find(worker);
  if (it == sets_.end()) return std::nullopt;
  Set set = std::move(it->second);
  sets_.erase(it);
  return set;
}

std::vector<StateSets::Due> StateSets::TakeDue(const ConsistencyController& rule) {
  std::vector<Due> out;
  for (auto it = sets_.begin(); it != sets_.end();) {
    const int w = it->first;
    const Set& set = it->second;
    const bool live = rule.clocks().IsLive(w) || rule.clocks().HasLeft(w);  // not a dead worker's
    const bool due = set.complete && rule.CanAnswerPull(w, set.first.clock);
    const std::optional<int> blocker = set.complete && !due ? rule.Blocker(w, set.first.clock) : std::nullopt;
    if (!live) {
      it = sets_.erase(it);
    } else if (due) {
      out.push_back({std::move(it->second), OkStatus()});
      it = sets_.erase(it);
    } else if (blocker) {
      // A worker that ended training since makes its point never come.
      Status refused = rule.BlockedError(set.first.clock, *blocker);
      out.push_back({std::move(it->second), std::move(refused)});
      it = sets_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace gradsync
