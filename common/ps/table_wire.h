// Embedding tables on the PS plane's wire: a job's tables in its JobConfig (INIT, checkpoints)
// and the table runs of a message's keys (wire::TableRun), one encoder and one decoder each, used
// by the worker, the shards and their backups.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/table/table_spec.h"
#include "gradsync.pb.h"

namespace gradsync {

void SetJobTables(std::span<const TableSpec> tables, wire::JobConfig* job);
// The job's tables. kInvalidArgument naming the table: one ValidateTableSpec refuses, an unknown
// row optimizer or initialization, two tables of one name, more than kMaxTables.
Result<std::vector<TableSpec>> JobTables(const wire::JobConfig& job);

void EncodeTableRuns(std::span<const TableRun> runs,
                     google::protobuf::RepeatedPtrField<wire::TableRun>* out);
// kInvalidArgument: a run of no ids, tables not in increasing order (each at most once), an index
// past kMaxTables, or runs whose ids do not add up to `num_keys`. Whether the tables exist is the
// receiver's to check.
Result<std::vector<TableRun>> DecodeTableRuns(
    const google::protobuf::RepeatedPtrField<wire::TableRun>& runs, uint64_t num_keys);

// The floats of the rows `runs` name in a job with these tables (each run's ids times its dim);
// kInvalidArgument for a table the job does not have.
Result<uint64_t> TableRowFloats(std::span<const TableRun> runs, std::span<const TableSpec> tables);

}  // namespace gradsync
