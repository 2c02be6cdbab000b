#include "allreduce/plan/fold.h"

namespace gradsync::plan_internal {

void AppendFold(int rank, int n, size_t count, Plan* plan) {
  const int rem = n - FloorPow2(n);
  if (rank >= 2 * rem) return;
  const ElementRange all{0, count};
  plan->push_back(rank % 2 == 0 ? SendStep(kFoldTag, rank + 1, all) : RecvStep(kFoldTag, rank - 1, all, /*reduce=*/true));
}

void AppendUnfold(int rank, int n, size_t count, Plan* plan) {
  const int rem = n - FloorPow2(n);
  if (rank >= 2 * rem) return;
  const ElementRange all{0, count};
  plan->push_back(rank % 2 == 0 ? RecvStep(kUnfoldTag, rank + 1, all) : SendStep(kUnfoldTag, rank - 1, all));
}

}  // namespace gradsync::plan_internal
