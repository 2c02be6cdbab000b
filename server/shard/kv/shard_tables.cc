#include "server/shard/kv/shard_tables.h"

#include <cstring>
#include <string>

#include "common/base/check.h"

namespace gradsync {
namespace {

// One push's scales for a table's optimizer (KvShard's rule): SGD's gradient 1/N, the adaptive
// ones' rate 1/N.
void PushScales(RowOptimizerKind kind, int num_workers, float* grad_scale, float* lr_scale) {
  const float inv = num_workers > 1 ? 1.0f / static_cast<float>(num_workers) : 1.0f;
  *grad_scale = kind == RowOptimizerKind::kSgd ? inv : 1.0f;
  *lr_scale = kind == RowOptimizerKind::kSgd ? 1.0f : inv;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
bool FromBytes(const std::string& b, std::vector<T>* out) {
  if (b.size() % sizeof(T) != 0) return false;
  out->resize(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(out->data(), b.data(), b.size());
  return true;
}

}  // namespace

ShardTables::ShardTables(const std::vector<TableSpec>& specs, int shard, int num_shards,
                         int num_workers)
    : shard_(shard), num_shards_(num_shards), num_workers_(num_workers) {
  tables_.reserve(specs.size());
  for (const TableSpec& spec : specs) tables_.emplace_back(spec, shard, num_shards);
}

int64_t ShardTables::rows() const { return TotalRows(tables_); }

uint64_t ShardTables::bytes() const { return TotalBytes(tables_); }

uint64_t ShardTables::Floats(std::span<const TableRun> runs) const {
  uint64_t n = 0;
  for (const TableRun& r : runs) n += r.ids * static_cast<uint64_t>(tables_[r.table].spec().dim);
  return n;
}

Status ShardTables::Validate(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                             const size_t* num_values) const {
  uint64_t total_ids = 0, floats = 0;
  for (const TableRun& r : runs) {
    if (r.table >= tables_.size()) {
      return InvalidArgumentError("table " + std::to_string(r.table) + " is not one of the job's " +
                                  std::to_string(tables_.size()) + " tables");
    }
    total_ids += r.ids;
    floats += r.ids * static_cast<uint64_t>(tables_[r.table].spec().dim);
  }
  if (total_ids != ids.size()) {
    return InvalidArgumentError("table runs name " + std::to_string(total_ids) +
                                " ids, the message carries " + std::to_string(ids.size()));
  }
  Status bad;
  ForEachRun(runs, ids, nullptr, [&](uint32_t t, std::span<const uint64_t> run, const float*) {
    if (bad.ok()) bad = tables_[t].CheckIds(run);
  });
  RETURN_IF_ERROR(bad);
  if (num_values != nullptr && *num_values != floats) {
    return InvalidArgumentError("table rows: " + std::to_string(*num_values) + " values for " +
                                std::to_string(floats) + " (each id's row of its table's dim)");
  }
  return OkStatus();
}

Status ShardTables::MakeRoom(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                             bool with_round) {
  // Every table is checked before any takes the rows, so a refusal changes nothing.
  Status bad;
  ForEachRun(runs, ids, nullptr, [&](uint32_t t, std::span<const uint64_t> run, const float*) {
    if (bad.ok()) bad = tables_[t].CheckRoom(run, with_round);
  });
  RETURN_IF_ERROR(bad);
  if (!with_round) return OkStatus();
  ForEachRun(runs, ids, nullptr, [&](uint32_t t, std::span<const uint64_t> run, const float*) {
    if (bad.ok()) bad = tables_[t].Reserve(run);
  });
  return bad;
}

void ShardTables::Read(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                       float* out) const {
  ForEachRun(runs, ids, nullptr, [&](uint32_t t, std::span<const uint64_t> run, const float*) {
    tables_[t].Read(run, out);
    out += run.size() * static_cast<size_t>(tables_[t].spec().dim);
  });
}

void ShardTables::Apply(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                        const float* values, float lr, float lr_scale) {
  ForEachRun(runs, ids, values, [&](uint32_t t, std::span<const uint64_t> run, const float* rows) {
    float grad_scale = 1.0f, push_lr_scale = 1.0f;
    PushScales(tables_[t].spec().optimizer.kind, num_workers_, &grad_scale, &push_lr_scale);
    // Checked before the push was taken (MakeRoom); a refusal here would be a bug of the caller.
    Status st = tables_[t].Apply(run, rows, lr, grad_scale, lr_scale * push_lr_scale);
    GRADSYNC_CHECK(st.ok()) << st.message();
  });
}

void ShardTables::Accumulate(std::span<const TableRun> runs, std::span<const uint64_t> ids,
                             const float* values) {
  ForEachRun(runs, ids, values, [&](uint32_t t, std::span<const uint64_t> run, const float* rows) {
    Status st = tables_[t].Accumulate(run, rows);
    GRADSYNC_CHECK(st.ok()) << st.message();
  });
}

void ShardTables::ApplyAccumulated(int count, float lr) {
  for (RowTable& t : tables_) {
    if (t.round_rows() > 0) t.ApplyAccumulated(count, lr);
  }
}

std::vector<wire::TableRowsCheckpoint> ShardTables::Save() const {
  std::vector<wire::TableRowsCheckpoint> out;
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].rows() == 0) continue;
    const TableRows rows = tables_[t].Save();
    wire::TableRowsCheckpoint& c = out.emplace_back();
    c.set_table(static_cast<uint32_t>(t));
    c.set_ids(Bytes(rows.ids));
    c.set_values(Bytes(rows.values));
    c.set_state(Bytes(rows.state));
    c.mutable_steps()->Assign(rows.steps.begin(), rows.steps.end());
  }
  return out;
}

Status ShardTables::Restore(
    const google::protobuf::RepeatedPtrField<wire::TableRowsCheckpoint>& saved) {
  std::vector<TableRows> rows(tables_.size());
  std::vector<bool> seen(tables_.size(), false);
  for (const wire::TableRowsCheckpoint& c : saved) {
    if (c.table() >= tables_.size() || seen[c.table()]) {
      return DataLossError("the checkpoint's rows of table " + std::to_string(c.table()) +
                           " are not one table of the job's " + std::to_string(tables_.size()));
    }
    seen[c.table()] = true;
    TableRows& r = rows[c.table()];
    if (!FromBytes(c.ids(), &r.ids) || !FromBytes(c.values(), &r.values) ||
        !FromBytes(c.state(), &r.state)) {
      return DataLossError("table '" + tables_[c.table()].spec().name +
                           "': the checkpoint's rows are cut");
    }
    r.steps.assign(c.steps().begin(), c.steps().end());
  }
  // Checked whole before any table changes: restore into copies, then swap them in.
  std::vector<RowTable> fresh;
  fresh.reserve(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    fresh.emplace_back(tables_[t].spec(), shard_, num_shards_);
    RETURN_IF_ERROR(fresh.back().Restore(rows[t]));
  }
  tables_ = std::move(fresh);
  return OkStatus();
}

}  // namespace gradsync
