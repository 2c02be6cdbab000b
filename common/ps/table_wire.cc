#include "common/ps/table_wire.h"

#include <string>

namespace gradsync {

void SetJobTables(std::span<const TableSpec> tables, wire::JobConfig* job) {
  job->clear_tables();
  for (const TableSpec& t : tables) {
    wire::TableConfig& c = *job->add_tables();
    c.set_name(t.name);
    c.set_dim(t.dim);
    c.set_num_ids(t.num_ids);
    c.set_init(RowInitName(t.init));
    c.set_init_seed(t.init_seed);
    c.set_max_rows_per_shard(t.max_rows_per_shard);
    c.set_optimizer(RowOptimizerKindName(t.optimizer.kind));
    c.set_eps(t.optimizer.eps);
    c.set_initial_accumulator(t.optimizer.initial_accumulator);
    c.set_beta1(t.optimizer.beta1);
    c.set_beta2(t.optimizer.beta2);
  }
}

Result<std::vector<TableSpec>> JobTables(const wire::JobConfig& job) {
  if (job.tables_size() > static_cast<int>(kMaxTables)) {
    return InvalidArgumentError("a job has at most " + std::to_string(kMaxTables) +
                                " tables, not " + std::to_string(job.tables_size()));
  }
  std::vector<TableSpec> out;
  for (const wire::TableConfig& c : job.tables()) {
    TableSpec t;
    t.name = c.name();
    t.dim = c.dim();
    t.num_ids = c.num_ids();
    auto init = ParseRowInit(c.init());
    if (!init.ok())
      return InvalidArgumentError("table '" + t.name + "': " + init.status().message());
    t.init = *init;
    t.init_seed = c.init_seed();
    t.max_rows_per_shard = c.max_rows_per_shard();
    auto kind = ParseRowOptimizerKind(c.optimizer());
    if (!kind.ok())
      return InvalidArgumentError("table '" + t.name + "': " + kind.status().message());
    t.optimizer.kind = *kind;
    t.optimizer.eps = c.eps();
    t.optimizer.initial_accumulator = c.initial_accumulator();
    t.optimizer.beta1 = c.beta1();
    t.optimizer.beta2 = c.beta2();
    out.push_back(std::move(t));
  }
  RETURN_IF_ERROR(ValidateTableSpecs(out));
  return out;
}

void EncodeTableRuns(std::span<const TableRun> runs,
                     google::protobuf::RepeatedPtrField<wire::TableRun>* out) {
  out->Clear();
  for (const TableRun& r : runs) {
    wire::TableRun& w = *out->Add();
    w.set_table(r.table);
    w.set_ids(r.ids);
  }
}

Result<std::vector<TableRun>> DecodeTableRuns(
    const google::protobuf::RepeatedPtrField<wire::TableRun>& runs, uint64_t num_keys) {
  std::vector<TableRun> out;
  out.reserve(static_cast<size_t>(runs.size()));
  uint64_t total = 0;
  for (const wire::TableRun& w : runs) {
    if (w.table() >= kMaxTables)
      return InvalidArgumentError("table index " + std::to_string(w.table()) + " is too large");
    if (!out.empty() && w.table() <= out.back().table) {
      return InvalidArgumentError("table runs must name each table once, in increasing order");
    }
    if (w.ids() == 0 || w.ids() > num_keys) {
      return InvalidArgumentError("a run of table " + std::to_string(w.table()) + " names " +
                                  std::to_string(w.ids()) + " ids of the message's " +
                                  std::to_string(num_keys) + " keys");
    }
    total += w.ids();
    out.push_back({w.table(), w.ids()});
  }
  if (!out.empty() && total != num_keys) {
    return InvalidArgumentError("table runs name " + std::to_string(total) +
                                " ids, the keys frame holds " + std::to_string(num_keys));
  }
  return out;
}

Result<uint64_t> TableRowFloats(std::span<const TableRun> runs, std::span<const TableSpec> tables) {
  uint64_t n = 0;
  for (const TableRun& r : runs) {
    if (r.table >= tables.size()) {
      return InvalidArgumentError("table " + std::to_string(r.table) + " is not one of the job's " +
                                  std::to_string(tables.size()) + " tables");
    }
    n += r.ids * static_cast<uint64_t>(tables[r.table].dim);
  }
  return n;
}

}  // namespace gradsync
