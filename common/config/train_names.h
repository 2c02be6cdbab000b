// The names of the run configuration's choices, as flags and specs spell them: one list each
// (common/config/train_config.h checks settings against them; models/ and worker/ build what they name).
// No protobuf here: CUDA sources include this through models/model.h.
#pragma once

#include <string>

namespace gradsync {

inline constexpr const char* kModeNames = "local|bsp|ssp|asp|allreduce";
inline constexpr const char* kModelNames = "softmax|mlp|sparse_logreg|dlrm";
inline constexpr const char* kDatasetNames = "fashion-mnist|blobs|sparse-logistic|click-log";
inline constexpr const char* kAllReduceAlgoNames = "auto|ring|rhd|rd|tree|shm|hier";  // allreduce/plan/algorithm.h

// Whether `name` is one of the '|'-separated `names`.
inline bool IsOneOf(const char* names, const std::string& name) {
  const std::string all = std::string("|") + names + "|";
  return !name.empty() && name.find('|') == std::string::npos && all.find("|" + name + "|") != std::string::npos;
}

}  // namespace gradsync
