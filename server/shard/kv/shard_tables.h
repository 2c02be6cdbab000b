// ShardTables: a shard's part of each of the job's embedding tables (common/table/row_table.h),
// addressed as messages address them: runs of ids per table (TableRun) and their rows in order.
// KvShard holds one and steps it with its dense parameters, at the same rate and in the same
// round; what a request may name, the bound's room, reads, the rows' part of checkpoints are here.
//
// One worker's push applied at once (ssp, asp) moves a row about 1/N of a step, as the dense
// parameters: SGD on g / N, Adagrad and Adam on g at rate lr / N. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/table/row_table.h"
#include "common/table/table_spec.h"
#include "gradsync.pb.h"

namespace gradsync {

class ShardTables {
 public:
  ShardTables() = default;
  // Shard `shard` of `num_shards`'s part of each table, for a job of `num_workers`.
  ShardTables(const std::vector<TableSpec>& specs, int shard, int num_shards, int num_workers);

  size_t size() const { return tables_.size(); }
  const RowTable& table(size_t t) const { return tables_[t]; }
  // Rows held over every table, and their memory in bytes (RowTable::bytes).
  int64_t rows() const;
  uint64_t bytes() const;

  // The floats of the rows `runs` name (each run's ids times its table's dim); runs validated.
  uint64_t Floats(std::span<const TableRun> runs) const;
  // What a request of `runs` over `ids` may be here: tables the job has, each run's ids as its
  // table takes them (RowTable::CheckIds), and with `num_values` the count of its rows' floats.
  Status Validate(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                  const size_t* num_values) const;
  // Whether a push of these rows fits under every table's bound: with the rows the open round
  // will create, entered in it (with_round: a push held for a bsp round, RowTable::Reserve), or
  // not (a push applied at once). kResourceExhausted naming the table, and nothing changes. (A
  // push refused after this, by the consistency rule, keeps its rows entered until the round is
  // applied: the bound is then counted a little high, never low.)
  Status MakeRoom(std::span<const TableRun> runs, std::span<const uint64_t> ids, bool with_round);
  // The rows of `runs` (their floats, in order, to `out`).
  void Read(std::span<const TableRun> runs, std::span<const uint64_t> ids, float* out) const;
  // One worker's row gradients now (ssp, asp), at rate lr * lr_scale with the 1/N above.
  void Apply(std::span<const TableRun> runs, std::span<const uint64_t> ids, const float* values,
             float lr, float lr_scale);
  // One worker's row gradients into the round (bsp), and the round's mean applied once at lr.
  void Accumulate(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                  const float* values);
  void ApplyAccumulated(int count, float lr);

  // The rows of each table that has any, as a checkpoint holds them, and put back from one.
  // Restore: kDataLoss naming the table when a table is not the job's or its rows are damaged
  // (RowTable::Restore); on failure nothing changes.
  std::vector<wire::TableRowsCheckpoint> Save() const;
  Status Restore(const google::protobuf::RepeatedPtrField<wire::TableRowsCheckpoint>& saved);

 private:
  // fn(table, its ids, its values) for each run, the values `floats` apart per id.
  template <typename Fn>
  void ForEachRun(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                  const float* values, Fn&& fn) const {
    size_t at = 0;
    for (const TableRun& r : runs) {
      const auto n = static_cast<size_t>(r.ids);
      fn(r.table, ids.subspan(at, n), values);
      if (values != nullptr) values += n * static_cast<size_t>(tables_[r.table].spec().dim);
      at += n;
    }
  }

  std::vector<RowTable> tables_;
  int shard_ = 0;
  int num_shards_ = 1;
  int num_workers_ = 1;
};

}  // namespace gradsync
