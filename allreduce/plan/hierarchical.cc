// The hierarchy across hosts, and the all-reduce by algorithm.
#include <algorithm>

#include "allreduce/plan/schedule.h"

namespace gradsync {

Plan HierarchicalPlan(int rank, const std::vector<std::vector<int>>& hosts, size_t count) {
  Plan plan;
  std::vector<int> leaders;
  const std::vector<int>* mine = nullptr;
  for (const auto& h : hosts) {
    if (h.empty()) continue;
    leaders.push_back(h.front());
    if (std::find(h.begin(), h.end(), rank) != h.end()) mine = &h;
  }
  if (mine == nullptr) return plan;
  const bool shared = mine->size() > 1;
  const ElementRange all{0, count};
  PlanStep phase;  // the shared-memory phases: no peers, the whole buffer
  phase.send = phase.recv = all;
  if (shared) {
    phase.reduce = true;
    phase.shm = PlanStep::Shm::kReduce;
    plan.push_back(phase);
  }
  const int l = static_cast<int>(leaders.size());
  if (l > 1 && mine->front() == rank) {
    const int pos = static_cast<int>(std::find(leaders.begin(), leaders.end(), rank) - leaders.begin());
    for (PlanStep s : RingAllReducePlan(pos, l, count)) {
      s.to = leaders[static_cast<size_t>(s.to)];
      s.from = leaders[static_cast<size_t>(s.from)];
      plan.push_back(s);
    }
  }
  if (shared) {
    phase.reduce = false;
    phase.shm = PlanStep::Shm::kBroadcast;
    plan.push_back(phase);
  }
  return plan;
}

Plan SharedMemoryPlan(size_t count) {
  PlanStep phase;
  phase.send = phase.recv = {0, count};
  phase.reduce = true;
  phase.shm = PlanStep::Shm::kAllReduce;
  return {phase};
}

ShmBytes SharedMemoryBytes(PlanStep::Shm phase, int index, int members, size_t count, size_t elem) {
  ShmBytes b;
  if (members <= 1 || phase == PlanStep::Shm::kNone) return b;
  const uint64_t all = count * elem, others = static_cast<uint64_t>(members - 1);
  if (phase == PlanStep::Shm::kBroadcast) {
    if (index == 0) b.sent = others * all;
    else b.received = all;
    return b;
  }
  // Each member sums its share of the buffer over every slot: the rest of its slot goes to the
  // others, their values of its share come in; then its sum goes to every other member
  // (all-reduce) or to the leader (reduce), and theirs come in.
  const uint64_t share = (ChunkBegin(count, members, index + 1) - ChunkBegin(count, members, index)) * elem;
  const uint64_t rest = all - share;
  const bool everyone = phase == PlanStep::Shm::kAllReduce;
  b.sent = rest + (everyone ? others * share : (index == 0 ? 0 : share));
  b.received = others * share + (everyone || index == 0 ? rest : 0);
  return b;
}

Plan AllReducePlan(AllReduceAlgo algo, int rank, int n, size_t count, const std::vector<std::vector<int>>& hosts) {
  if (n <= 1) return {};
  switch (algo) {
    case AllReduceAlgo::kRhd: return HalvingDoublingPlan(rank, n, count);
    case AllReduceAlgo::kRd: return RecursiveDoublingPlan(rank, n, count);
    case AllReduceAlgo::kTree: return TreePlan(rank, n, count);
    case AllReduceAlgo::kShm: return SharedMemoryPlan(count);
    case AllReduceAlgo::kHier: return HierarchicalPlan(rank, hosts, count);
    default: return RingAllReducePlan(rank, n, count);
  }
}

}  // namespace gradsync
