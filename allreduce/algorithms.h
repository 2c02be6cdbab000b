// The all-reduce algorithm of a flag or a spec, with the error a user reads: the algorithms
// themselves, auto's choice and their steps are in allreduce/plan/.
#pragma once

#include <string>

#include "allreduce/plan/algorithm.h"
#include "common/base/status.h"
#include "common/config/train_names.h"

namespace gradsync {

// "auto", "ring", "rhd", "rd", "tree", "shm" or "hier"; anything else is an error naming them.
inline Result<AllReduceAlgo> ParseAllReduceAlgo(const std::string& name) {
  if (auto algo = AllReduceAlgoNamed(name)) return *algo;
  return InvalidArgumentError("unknown all-reduce algorithm '" + name + "' (expected " + kAllReduceAlgoNames + ")");
}

}  // namespace gradsync
