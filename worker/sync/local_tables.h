// LocalTables: a process's own copy of a model's embedding tables (each whole: shard 0 of 1,
// common/table/row_table.h), for --mode=local and for each worker's replica in --mode=allreduce
// (worker/allreduce/tables/row_gather.h): a step's rows read from it, their gradients applied with the
// rows' optimizer at the step's rate (local: Apply; all-reduce: every worker's gradients summed
// per id in a round, Accumulate, and their mean applied once, ApplyAccumulated, as a bsp shard
// does), rows created on their first gradient as the shards create them. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/table/row_table.h"

namespace gradsync {

class LocalTables {
 public:
  explicit LocalTables(const std::vector<TableSpec>& specs);

  bool empty() const { return tables_.empty(); }
  // The rows of `ids` (per table, sorted and unique) into `rows` (table after table, id after id);
  // kInvalidArgument naming the table for ids it cannot hold, or a size that does not fit.
  Status Read(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) const;
  // One step of each row by its gradient (grads laid out as Read's rows) at `lr`.
  // kResourceExhausted naming the table when the rows it would create pass its bound; nothing of
  // that table changes.
  Status Apply(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads, float lr);
  // Adds one worker's row gradients (laid out as Read's rows, exactly as many) to the open round's
  // sums per id (RowTable::Accumulate), in the order the workers are added. kInvalidArgument for
  // ids or a size that do not fit, kResourceExhausted naming the table when the round's rows would
  // pass its bound; either way the whole round is dropped (nothing of it stays or is applied).
  Status Accumulate(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads);
  // Applies the round's mean over `count` workers once per row at `lr`, and empties it.
  void ApplyAccumulated(int count, float lr);
  // Forgets the open round.
  void DropRound();
  // Rows held over every table, and their memory in bytes.
  int64_t rows() const;
  uint64_t bytes() const;

 private:
  // The floats `ids` name, or kInvalidArgument when there is not one id list per table.
  Result<size_t> Floats(std::span<const std::vector<uint64_t>> ids) const;

  std::vector<RowTable> tables_;
};

}  // namespace gradsync
