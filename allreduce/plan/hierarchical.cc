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

ShmBytes SharedMemoryBlockBytes(PlanStep::Shm phase, int index, int members, uint64_t share, uint64_t block) {
  ShmBytes b;
  if (members <= 1 || phase == PlanStep::Shm::kNone) return b;
  const uint64_t others = static_cast<uint64_t>(members - 1);
  if (phase == PlanStep::Shm::kBroadcast) {
    if (index == 0) b.sent = others * block;
    else b.received = block;
    return b;
  }
  // The rest of its slot goes to the members who sum it, their values of its share come in; its
  // sum goes to every other member (all-reduce) or to the leader (reduce), and theirs come in.
  const uint64_t rest = block - share;
  const bool everyone = phase == PlanStep::Shm::kAllReduce;
  b.sent = rest + (everyone ? others * share : (index == 0 ? 0 : share));
  b.received = others * share + (everyone || index == 0 ? rest : 0);
  return b;
}

ShmBytes SharedMemoryBytes(PlanStep::Shm phase, int index, int members, size_t count, size_t elem, size_t block_bytes) {
  ShmBytes total;
  if (members <= 1 || count == 0) return total;
  auto add = [&](ShmBytes b) {
    total.sent += b.sent;
    total.received += b.received;
  };
  if (phase == PlanStep::Shm::kBroadcast) {
    const size_t bytes = count * elem;
    for (size_t off = 0; off < bytes; off += block_bytes) add(SharedMemoryBlockBytes(phase, index, members, 0, std::min(block_bytes, bytes - off)));
    return total;
  }
  const size_t block_elems = std::max<size_t>(1, block_bytes / elem);
  for (size_t first = 0; first < count; first += block_elems) {
    const size_t k = std::min(block_elems, count - first);
    const uint64_t share = (ChunkBegin(k, members, index + 1) - ChunkBegin(k, members, index)) * elem;
    add(SharedMemoryBlockBytes(phase, index, members, share, k * elem));
  }
  return total;
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
