// The embedding tables of a Python frontend's model (gradsync.torch.Embedding / EmbeddingBag),
// native side: where a forward's rows are read, and where a step's row gradients wait until the
// step is finished. The rows live on the PS shards (the PS modes), in every worker's replica kept
// equal by an all-gather of each step's rows (mode allreduce), or in this process (mode local,
// LocalTables): in every mode the process holds only the rows its batches read, never a table.
//
//   FrontendTables tables(specs, sync);        // sync: the job's GradientSync, null in mode local
//   tables.Read(0, ids, rows);                 // a forward: table 0's rows of `ids` (sorted, unique)
//   tables.SetGrads(0, ids, grads);            // after backward: their gradients, summed per id
//   tables.Finish(lr);                         // before the sync's FinishStep: they go with the push
//   ... sync->FinishStep() ...  tables.Clear();
//
// Threading: the sync's training thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/table/table_spec.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/local_tables.h"

namespace gradsync::python {

class FrontendTables {
 public:
  // `sync` (may be null: mode local, the tables then live here) must outlive this.
  FrontendTables(std::vector<TableSpec> specs, GradientSync* sync);

  const std::vector<TableSpec>& specs() const { return specs_; }
  bool empty() const { return specs_.empty(); }
  // Table t's rows of `ids` (sorted ascending and unique; CheckTableIds, by the sync or the local
  // tables that read them) into `rows` (ids.size() x dim floats), as the step reads them (PS:
  // pulled from the shards at the sync's clock). kInvalidArgument naming the table for a bad id or
  // table index.
  Status Read(size_t table, std::span<const uint64_t> ids, std::span<float> rows);
  // This step's gradients of table t's rows `ids` (sorted, unique), `grads` laid out as Read's
  // rows, already summed per id and scaled as the mean loss's; a second call for the same table
  // in one step replaces the first.
  Status SetGrads(size_t table, std::span<const uint64_t> ids, std::span<const float> grads);
  // Hands the step's row gradients to the sync (SetStepTables: FinishStep sends or applies them),
  // or, in mode local, applies them here at `lr`. Nothing set: nothing happens.
  Status Finish(float lr);
  // After the sync's FinishStep (or an abandoned step): the step's gradients are forgotten.
  void Clear();
  // Rows this step's gradients name, over every table.
  int64_t step_rows() const;
  // Mode local: rows held here, over every table (the others: 0, the rows are elsewhere).
  int64_t local_rows() const { return local_ ? local_->rows() : 0; }

 private:
  Status CheckTable(size_t table) const;

  std::vector<TableSpec> specs_;
  GradientSync* sync_;
  std::optional<LocalTables> local_;       // mode local: the tables, whole
  std::vector<std::vector<uint64_t>> read_ids_;  // Read: one table's ids, the others empty
  std::vector<std::vector<uint64_t>> ids_;  // per table: this step's ids with a gradient
  std::vector<std::vector<float>> grads_;   // per table: their gradients
  std::vector<float> flat_;                 // Finish: the gradients table after table
  TableStep step_;
};

}  // namespace gradsync::python
