// Recursive halving then recursive doubling (Rabenseifner). The buffer is cut in FloorPow2(n)
// blocks; each halving step keeps the half of the current range that holds this rank's block,
// sends the other half to the partner (which keeps it) and sums what arrives; each doubling step
// swaps the reduced ranges, each arriving where it belongs.
#include <algorithm>

#include "allreduce/plan/fold.h"

namespace gradsync {

Plan HalvingDoublingPlan(int rank, int n, size_t count) {
  Plan plan;
  plan_internal::AppendFold(rank, n, count, &plan);
  const int p2 = FloorPow2(n), v = FoldedRank(rank, n);
  if (v >= 0) {
    auto at = [&](int block) { return ChunkBegin(count, p2, block); };
    int lo = 0, hi = p2;  // the blocks this rank is responsible for
    uint32_t tag = 1;
    for (int mask = p2 / 2; mask >= 1; mask >>= 1, ++tag) {
      const int partner = UnfoldedRank(v ^ mask, n);
      const int mid = lo + (hi - lo) / 2;
      const bool lower = (v & mask) == 0;
      const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const int send_lo = lower ? mid : lo, send_hi = lower ? hi : mid;
      plan.push_back(SwapStep(tag, partner, {at(send_lo), at(send_hi)}, {at(keep_lo), at(keep_hi)}, /*reduce=*/true));
      lo = keep_lo;
      hi = keep_hi;
    }
    for (int mask = 1; mask < p2; mask <<= 1, ++tag) {
      const int partner = UnfoldedRank(v ^ mask, n);
      const int width = hi - lo;
      const int plo = (v & mask) == 0 ? hi : lo - width, phi = plo + width;
      plan.push_back(SwapStep(tag, partner, {at(lo), at(hi)}, {at(plo), at(phi)}, /*reduce=*/false));
      lo = std::min(lo, plo);
      hi = std::max(hi, phi);
    }
  }
  plan_internal::AppendUnfold(rank, n, count, &plan);
  return plan;
}

}  // namespace gradsync
