#include "worker/ps/table_plan.h"

#include <cstring>
#include <string>

namespace gradsync {

TablePlan::TablePlan(std::vector<TableSpec> tables, int num_shards)
    : tables_(std::move(tables)),
      shards_(static_cast<size_t>(num_shards)),
      table_offset_(tables_.size(), 0) {}

void TablePlan::Clear() {
  // Emptied, its vectors' memory kept: a step's plan is made again every step.
  for (Shard& s : shards_) {
    s.runs.clear();
    s.ids.clear();
    s.at.clear();
    s.dim.clear();
    s.floats = 0;
  }
  floats_ = 0;
}

Status TablePlan::Set(std::span<const std::vector<uint64_t>> ids) {
  Clear();
  if (ids.size() != tables_.size()) {
    return InvalidArgumentError("a step names ids of " + std::to_string(ids.size()) +
                                " tables, the job has " + std::to_string(tables_.size()));
  }
  const int num_shards = static_cast<int>(shards_.size());
  uint64_t at = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (Status st = CheckTableIds(tables_[t], ids[t]); !st.ok()) {
      Clear();
      return st;
    }
    table_offset_[t] = at;
    const int dim = tables_[t].dim;
    for (uint64_t id : ids[t]) {
      Shard& s = shards_[static_cast<size_t>(TableShardOf(id, num_shards))];
      if (s.runs.empty() || s.runs.back().table != t)
        s.runs.push_back({static_cast<uint32_t>(t), 0});
      ++s.runs.back().ids;
      s.ids.push_back(id);
      s.at.push_back(at);
      s.dim.push_back(dim);
      s.floats += static_cast<uint64_t>(dim);
      at += static_cast<uint64_t>(dim);
    }
  }
  floats_ = at;
  return OkStatus();
}

void TablePlan::Gather(int s, ConstFloatSpan step_rows, float* out) const {
  const Shard& sh = shards_[static_cast<size_t>(s)];
  for (size_t i = 0; i < sh.ids.size(); ++i) {
    const auto n = static_cast<size_t>(sh.dim[i]);
    std::memcpy(out, step_rows.data() + sh.at[i], n * sizeof(float));
    out += n;
  }
}

void TablePlan::Scatter(int s, const float* rows, FloatSpan step_rows) const {
  const Shard& sh = shards_[static_cast<size_t>(s)];
  for (size_t i = 0; i < sh.ids.size(); ++i) {
    const auto n = static_cast<size_t>(sh.dim[i]);
    std::memcpy(step_rows.data() + sh.at[i], rows, n * sizeof(float));
    rows += n;
  }
}

}  // namespace gradsync
