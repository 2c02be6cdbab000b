// Recursive doubling: each step swaps whole buffers with the partner and sums what arrives, so
// both get the same sum (a + b == b + a).
#include "allreduce/plan/fold.h"

namespace gradsync {

Plan RecursiveDoublingPlan(int rank, int n, size_t count) {
  Plan plan;
  plan_internal::AppendFold(rank, n, count, &plan);
  const int p2 = FloorPow2(n), v = FoldedRank(rank, n);
  if (v >= 0) {
    uint32_t tag = 1;
    for (int mask = 1; mask < p2; mask <<= 1, ++tag) {
      const int partner = UnfoldedRank(v ^ mask, n);
      plan.push_back(SwapStep(tag, partner, {0, count}, {0, count}, /*reduce=*/true));
    }
  }
  plan_internal::AppendUnfold(rank, n, count, &plan);
  return plan;
}

}  // namespace gradsync
