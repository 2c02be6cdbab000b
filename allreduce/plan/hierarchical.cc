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

Plan AllReducePlan(AllReduceAlgo algo, int rank, int n, size_t count, const std::vector<std::vector<int>>& hosts) {
  if (n <= 1) return {};
  switch (algo) {
    case AllReduceAlgo::kRhd: return HalvingDoublingPlan(rank, n, count);
    case AllReduceAlgo::kRd: return RecursiveDoublingPlan(rank, n, count);
    case AllReduceAlgo::kTree: return TreePlan(rank, n, count);
    case AllReduceAlgo::kShm:
    case AllReduceAlgo::kHier: {
      if (!hosts.empty()) return HierarchicalPlan(rank, hosts, count);
      std::vector<int> one(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) one[static_cast<size_t>(i)] = i;
      return HierarchicalPlan(rank, {one}, count);
    }
    default: return RingAllReducePlan(rank, n, count);
  }
}

}  // namespace gradsync
