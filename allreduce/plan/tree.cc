// A binomial tree rooted at rank 0: at level k, a rank whose lowest set bit is 2^k sends its
// partial sum to rank - 2^k and drops out; rank 0 ends with the sum and it flows back down the
// same edges, parents sending to their farthest child first.
#include <bit>

#include "allreduce/plan/schedule.h"

namespace gradsync {

Plan TreePlan(int rank, int n, size_t count) {
  Plan plan;
  const ElementRange all{0, count};
  uint32_t level = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++level) {
    if (rank & mask) {
      plan.push_back(SendStep(level, rank - mask, all));
      break;
    }
    if (rank + mask < n) plan.push_back(RecvStep(level, rank + mask, all, /*reduce=*/true));
  }
  // The broadcast: from the parent (the edge at this rank's lowest set bit), then to the children.
  int top = 1;  // children are rank + mask for mask < top
  if (rank > 0) {
    top = rank & -rank;
    plan.push_back(RecvStep(kBroadcastTag + static_cast<uint32_t>(std::countr_zero(static_cast<unsigned>(top))), rank - top, all));
  } else {
    while (top < n) top <<= 1;
  }
  for (int mask = top >> 1; mask >= 1; mask >>= 1) {
    if (rank + mask >= n) continue;
    plan.push_back(SendStep(kBroadcastTag + static_cast<uint32_t>(std::countr_zero(static_cast<unsigned>(mask))), rank + mask, all));
  }
  return plan;
}

}  // namespace gradsync
