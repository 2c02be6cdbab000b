#include "worker/sync/local_tables.h"

#include <string>

namespace gradsync {

LocalTables::LocalTables(const std::vector<TableSpec>& specs) {
  tables_.reserve(specs.size());
  for (const TableSpec& spec : specs) tables_.emplace_back(spec, 0, 1);
}

Result<size_t> LocalTables::Floats(std::span<const std::vector<uint64_t>> ids) const {
  if (ids.size() != tables_.size()) {
    return InvalidArgumentError("a step names ids of " + std::to_string(ids.size()) +
                                " tables, the model has " + std::to_string(tables_.size()));
  }
  size_t n = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    RETURN_IF_ERROR(tables_[t].CheckIds(ids[t]));
    n += ids[t].size() * static_cast<size_t>(tables_[t].spec().dim);
  }
  return n;
}

Status LocalTables::Read(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) const {
  ASSIGN_OR_RETURN(const size_t n, Floats(ids));
  if (rows.size() < n)
    return InvalidArgumentError("the rows' buffer is shorter than the batch's rows");
  float* out = rows.data();
  for (size_t t = 0; t < tables_.size(); ++t) {
    tables_[t].Read(ids[t], out);
    out += ids[t].size() * static_cast<size_t>(tables_[t].spec().dim);
  }
  return OkStatus();
}

Status LocalTables::Apply(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads,
                          float lr) {
  ASSIGN_OR_RETURN(const size_t n, Floats(ids));
  if (grads.size() < n)
    return InvalidArgumentError("the rows' gradients are shorter than the batch's rows");
  const float* g = grads.data();
  for (size_t t = 0; t < tables_.size(); ++t) {
    RETURN_IF_ERROR(tables_[t].Apply(ids[t], g, lr, 1.0f, 1.0f));
    g += ids[t].size() * static_cast<size_t>(tables_[t].spec().dim);
  }
  return OkStatus();
}

Status LocalTables::Accumulate(std::span<const std::vector<uint64_t>> ids,
                               std::span<const float> grads) {
  Result<size_t> n = Floats(ids);
  Status st = n.ok() ? OkStatus() : n.status();
  if (st.ok() && grads.size() != *n) {
    st = InvalidArgumentError("the rows' gradients hold " + std::to_string(grads.size()) +
                              " floats, the rows " + std::to_string(*n));
  }
  const float* g = grads.data();
  for (size_t t = 0; st.ok() && t < tables_.size(); ++t) {
    st = tables_[t].Accumulate(ids[t], g);
    g += ids[t].size() * static_cast<size_t>(tables_[t].spec().dim);
  }
  if (!st.ok()) DropRound();
  return st;
}

void LocalTables::ApplyAccumulated(int count, float lr) {
  for (RowTable& t : tables_) t.ApplyAccumulated(count, lr);
}

void LocalTables::DropRound() {
  for (RowTable& t : tables_) t.DropRound();
}

int64_t LocalTables::rows() const { return TotalRows(tables_); }

uint64_t LocalTables::bytes() const { return TotalBytes(tables_); }

}  // namespace gradsync
