// LocalTables: a process's own copy of a model's embedding tables (each whole: shard 0 of 1,
// common/table/row_table.h), for --mode=local: a step's rows read from it, their gradients
// applied with the rows' optimizer at the step's rate, rows created on their first gradient as
// the shards create them. Not thread-safe.
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
  // Rows held over every table, and their memory in bytes.
  int64_t rows() const;
  uint64_t bytes() const;

 private:
  // The floats `ids` name, or kInvalidArgument when there is not one id list per table.
  Result<size_t> Floats(std::span<const std::vector<uint64_t>> ids) const;

  std::vector<RowTable> tables_;
};

}  // namespace gradsync
