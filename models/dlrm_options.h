// DlrmOptions: the sizes and table settings of models/dlrm.h's DlrmModel. A header of its own so
// that model.h's ModelOptions can hold one (dlrm.h includes model.h). No CUDA-unfriendly include:
// CUDA sources include this through model.h.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/base/status.h"
#include "common/table/table_spec.h"

namespace gradsync {

struct DlrmOptions {
  int num_dense = 13;   // dense features, [1, 65536]
  int num_tables = 26;  // categorical features, one table each, [1, kMaxTables]
  int dim = 16;         // embedding dimension d (the bottom MLP's output too), [1, 65536]
  // Ids per table: a table [0, ids_per_table) (the click log's ids_per_feature), or 0: any 64-bit
  // id (hashed features).
  uint64_t ids_per_table = 0;
  // The bottom MLP's hidden sizes (then dim), the top MLP's (then 1); each in [1, 2^20]; either
  // may be empty (one linear layer).
  std::vector<int64_t> bottom = {64};
  std::vector<int64_t> top = {64};
  // The rows' initial value; unset: DLRM's U(-sqrt(1/n), sqrt(1/n)) for a table of n ids, and
  // N(0, 0.01^2) for tables of any 64-bit id.
  std::optional<RowInit> init;
  int64_t max_rows_per_shard = int64_t{1} << 24;  // TableSpec's bound
  RowOptimizerOptions optimizer;                  // the shards' row optimizer
};

// One line naming the first bad option (kInvalidArgument), or OK.
Status ValidateDlrmOptions(const DlrmOptions& options);

// The init DlrmOptions' unset `init` stands for: uniform sqrt(1/ids_per_table), or normal 0.01.
RowInit DefaultDlrmRowInit(uint64_t ids_per_table);

}  // namespace gradsync
