// Embedding tables on the parameter server (ARCHITECTURE.md, "Tables"): what a table is, which
// shard holds each of its rows, and the value a row has before any gradient touched it. Servers,
// the PS client, the Python frontend and the single-process reference all use these.
//
// A table is rows of `dim` floats addressed by 64-bit ids: either a fixed id space [0, num_ids)
// (an nn.Embedding(num_ids, dim)), or num_ids = 0, any 64-bit id (hashed features). Rows are spread
// over the shards by a hash of the id (TableShardOf), so popular ids, which Zipf puts close
// together, still fall on every shard alike. A shard creates a row when a gradient first touches
// it (common/table/); until then a read answers the row's initial value, a pure function of
// (init_seed, id) (InitRow): every run, replica and restarted shard agrees on it without storing
// it. A shard holds at most max_rows_per_shard rows; a push that would pass the bound is refused
// (kResourceExhausted, naming the table) and changes nothing.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/base/status.h"
#include "common/optim/row_optimizer.h"

namespace gradsync {

// A row's initial value: each of its floats drawn from N(0, scale^2) (nn.Embedding's rule with
// scale 1), U(-scale, scale) (DLRM's, with scale sqrt(1 / num_ids)), or zero.
struct RowInit {
  enum class Kind { kNormal, kUniform, kZeros };
  Kind kind = Kind::kNormal;
  float scale = 1.0f;
};

// "normal:STD" | "uniform:A" | "zeros" (and "normal", "uniform": scale 1), as flags and specs write
// it.
Result<RowInit> ParseRowInit(const std::string& text);
std::string RowInitName(const RowInit& init);

struct TableSpec {
  std::string name;
  int dim = 0;
  uint64_t num_ids = 0;  // 0: any 64-bit id
  RowInit init;
  uint64_t init_seed = 0;
  int64_t max_rows_per_shard = int64_t{1} << 24;
  RowOptimizerOptions optimizer;
};

// A run of ids of one table in a message's keys (wire::TableRun): `ids` keys of table `table` (its
// index in the job's tables), their rows in the values in the same order.
struct TableRun {
  uint32_t table = 0;
  uint64_t ids = 0;
  bool operator==(const TableRun&) const = default;
};
// The most tables a job may have.
inline constexpr uint32_t kMaxTables = 1024;

// The largest bound a shard may be given (its row slots are 32-bit).
inline constexpr int64_t kMaxTableRowsPerShard = int64_t{1} << 31;

// kInvalidArgument, one line naming the table: an empty name, dim < 1 or past 2^16, a scale that
// is negative or not finite, a bound < 1 or past kMaxTableRowsPerShard, a bad optimizer option.
Status ValidateTableSpec(const TableSpec& spec);
// A model's or job's tables: at most kMaxTables, each valid (ValidateTableSpec), no two with one
// name. kInvalidArgument, one line naming the first table at fault.
Status ValidateTableSpecs(std::span<const TableSpec> specs);

// The shard (of num_shards) that holds row `id` of any table.
int TableShardOf(uint64_t id, int num_shards);

// Writes row `id`'s initial value (spec.dim floats) to `row`.
void InitRow(const TableSpec& spec, uint64_t id, float* row);

// The ids a request may name: sorted ascending, unique, each < num_ids when the table has a fixed
// size. kInvalidArgument naming the table and the first offending id (for a fixed-size table an
// id past the end, which is also what a negative id becomes as a 64-bit one).
Status CheckTableIds(const TableSpec& spec, std::span<const uint64_t> ids);

}  // namespace gradsync
