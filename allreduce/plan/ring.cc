// The ring's steps (reduce-scatter, all-gather, all-reduce), the ring broadcast and the ring
// all-gather of per-rank blocks.
#include "allreduce/plan/schedule.h"

namespace gradsync {

Plan RingPlan(int rank, int n, size_t count, int first, int last, std::span<const size_t> bounds) {
  Plan plan;
  if (n <= 1) return plan;
  const int r = rank;
  // Chunk numbering: rank r receives chunk r - t - 2 at reduce-scatter step t (so that it ends
  // with chunk r reduced) and chunk r - (t - (n - 1)) - 1 at all-gather step t; it sends at step
  // t what it received at step t - 1 (at step 0 chunk r - 1).
  auto recv_chunk = [&](int t) { return t < n - 1 ? (r - t - 2 + 2 * n) % n : (r - (t - (n - 1)) - 1 + 2 * n) % n; };
  auto send_chunk = [&](int t) { return t == 0 ? (r - 1 + n) % n : recv_chunk(t - 1); };
  auto chunk = [&](int c) -> ElementRange {
    if (bounds.empty()) return {ChunkBegin(count, n, c), ChunkBegin(count, n, c + 1)};
    return {bounds[static_cast<size_t>(c)], bounds[static_cast<size_t>(c) + 1]};
  };
  plan.reserve(static_cast<size_t>(last - first));
  for (int t = first; t < last; ++t) {
    PlanStep s;
    s.tag = static_cast<uint32_t>(t);
    s.to = (r + 1) % n;
    s.send = chunk(send_chunk(t));
    s.from = (r - 1 + n) % n;
    s.recv = chunk(recv_chunk(t));
    s.reduce = t < n - 1;
    plan.push_back(s);
  }
  return plan;
}

Plan RingAllReducePlan(int rank, int n, size_t count) { return RingPlan(rank, n, count, 0, 2 * (n - 1)); }

Plan BroadcastPlan(int rank, int n, int root, size_t bytes, size_t segment_bytes) {
  Plan plan;
  if (n <= 1) return plan;
  const int pos = (rank - root + n) % n;  // distance from the root along the ring
  const size_t seg = segment_bytes > 0 ? segment_bytes : kDefaultSegmentBytes;
  const size_t segments = bytes == 0 ? 1 : (bytes + seg - 1) / seg;
  for (size_t k = 0; k < segments; ++k) {
    const size_t off = k * seg, end = off + (bytes - off < seg ? bytes - off : seg);
    const ElementRange piece{off < bytes ? off : bytes, off < bytes ? end : bytes};
    const uint32_t tag = static_cast<uint32_t>(k);
    if (pos > 0) plan.push_back(RecvStep(tag, (rank - 1 + n) % n, piece));
    if (pos < n - 1) plan.push_back(SendStep(tag, (rank + 1) % n, piece));
  }
  return plan;
}

Plan AllGatherPlan(int rank, int n) {
  Plan plan;
  if (n <= 1) return plan;
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < n - 1; ++s) {
      const size_t send = static_cast<size_t>((rank - s + n) % n), recv = static_cast<size_t>((rank - s - 1 + n) % n);
      PlanStep step = SendStep(static_cast<uint32_t>(round * (n - 1) + s), (rank + 1) % n, {send, send + 1});
      step.from = (rank - 1 + n) % n;
      step.recv = {recv, recv + 1};
      plan.push_back(step);
    }
  }
  return plan;
}

uint64_t AllGatherWireBytes(const PlanStep& s, int n, std::span<const size_t> sizes) {
  if (s.to < 0) return 0;
  const bool sizes_round = s.tag < static_cast<uint32_t>(n - 1);
  return kStepHeaderBytes + (sizes_round ? sizeof(uint64_t) : sizes[s.send.begin]);
}

}  // namespace gradsync
