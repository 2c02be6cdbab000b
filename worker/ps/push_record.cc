#include "worker/ps/push_record.h"

#include <algorithm>
#include <string>

namespace gradsync {

Status PushRecord::MarkAbsent(const std::vector<TensorInfo>& layout, size_t tensor) {
  if (tensor >= layout.size()) {
    return InvalidArgumentError("absent tensor " + std::to_string(tensor) + " of " + std::to_string(layout.size()));
  }
  if (layout[tensor].sparse) return InvalidArgumentError("tensor '" + layout[tensor].name + "' is sparse: its keys say what it has");
  if (tensor < ready_.size() && ready_[tensor]) {
    return FailedPreconditionError("tensor '" + layout[tensor].name + "': its gradient was already reported ready");
  }
  absent_.push_back(static_cast<uint32_t>(tensor));
  return OkStatus();
}

std::span<const uint32_t> PushRecord::TakeAbsent() {
  std::sort(absent_.begin(), absent_.end());
  absent_.erase(std::unique(absent_.begin(), absent_.end()), absent_.end());
  last_absent_.swap(absent_);
  absent_.clear();
  return last_absent_;
}

void PushRecord::GatherSparse(const Model& model, bool sparse) {
  keys_.clear();
  values_.clear();
  for (size_t t = 0; sparse && t < model.layout().size(); ++t) {
    const TensorInfo& ti = model.layout()[t];
    if (!ti.sparse) continue;
    const SparseGrad& g = model.sparse_grad(t);
    for (size_t i = 0; i < g.keys.size(); ++i) {
      keys_.push_back(static_cast<uint64_t>(ti.offset) + g.keys[i]);
      values_.push_back(g.values[i]);
    }
  }
}

}  // namespace gradsync
