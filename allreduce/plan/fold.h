// The fold that recursive doubling and halving-doubling run on a rank count that is not a power
// of two (allreduce/plan/algorithm.h, FoldedRank). Private to allreduce/plan/.
#pragma once

#include "allreduce/plan/schedule.h"

namespace gradsync::plan_internal {

// The first 2r ranks pair up: the even one hands its whole buffer to the odd one, which sums it in.
void AppendFold(int rank, int n, size_t count, Plan* plan);
// At the end the odd one hands the result back.
void AppendUnfold(int rank, int n, size_t count, Plan* plan);

}  // namespace gradsync::plan_internal
