// TablePlan: a step's table rows as the shards hold them. The step names, per table, the sorted
// unique ids its batch reads (the model's order: its rows lie table after table, id after id, in
// one buffer); the shards hold rows by a hash of the id (TableShardOf). The plan cuts the ids into
// one message's runs per shard and remembers where each shard's rows lie in the step's buffer, so
// that pulled rows land in place (Scatter) and pushed gradients are gathered per shard (Gather).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/table/table_spec.h"

namespace gradsync {

class TablePlan;

// A step's table rows for one request: the plan whose ids are set, and the step's buffer of their
// rows (plan->floats()): a push reads the row gradients from it, a pull writes the rows into it.
struct StepRows {
  const TablePlan* plan = nullptr;
  FloatSpan rows;
};

class TablePlan {
 public:
  TablePlan() = default;
  TablePlan(std::vector<TableSpec> tables, int num_shards);

  const std::vector<TableSpec>& tables() const { return tables_; }
  // The step's ids: ids[t], table t's, sorted and unique (checked: kInvalidArgument naming the
  // table and the id, CheckTableIds). On failure the plan is empty.
  Status Set(std::span<const std::vector<uint64_t>> ids);
  // The floats of the step's rows (every id's row), and where table t's begin among them.
  uint64_t floats() const { return floats_; }
  uint64_t table_offset(size_t t) const { return table_offset_[t]; }

  // Shard s's message: its runs, their ids in order, and their rows' floats.
  std::span<const TableRun> runs(int s) const { return shards_[static_cast<size_t>(s)].runs; }
  std::span<const uint64_t> ids(int s) const { return shards_[static_cast<size_t>(s)].ids; }
  uint64_t floats(int s) const { return shards_[static_cast<size_t>(s)].floats; }
  bool empty() const { return floats_ == 0; }

  // Shard s's rows of `step_rows` (the step's buffer), in its message's order, to `out`.
  void Gather(int s, ConstFloatSpan step_rows, float* out) const;
  // Shard s's rows (`rows`, floats(s) of them in its message's order) into `step_rows`.
  void Scatter(int s, const float* rows, FloatSpan step_rows) const;

 private:
  void Clear();

  struct Shard {
    std::vector<TableRun> runs;
    std::vector<uint64_t> ids;
    std::vector<uint64_t> at;  // per id: its row's first float in the step's buffer
    std::vector<int> dim;      // per id: its table's dim
    uint64_t floats = 0;
  };

  std::vector<TableSpec> tables_;
  std::vector<Shard> shards_;
  std::vector<uint64_t> table_offset_;
  uint64_t floats_ = 0;
};

}  // namespace gradsync
