#include "python/native/frontend_tables.h"

#include <string>

namespace gradsync::python {

FrontendTables::FrontendTables(std::vector<TableSpec> specs, GradientSync* sync)
    : specs_(std::move(specs)), sync_(sync), read_ids_(specs_.size()), ids_(specs_.size()), grads_(specs_.size()) {
  if (sync_ == nullptr && !specs_.empty()) local_.emplace(specs_);
}

Status FrontendTables::CheckTable(size_t table) const {
  if (table >= specs_.size()) {
    return InvalidArgumentError("table " + std::to_string(table) + ": the model has " + std::to_string(specs_.size()) +
                                " table(s)");
  }
  return OkStatus();
}

Status FrontendTables::Read(size_t table, std::span<const uint64_t> ids, std::span<float> rows) {
  RETURN_IF_ERROR(CheckTable(table));
  const TableSpec& spec = specs_[table];
  if (rows.size() != ids.size() * static_cast<size_t>(spec.dim)) {
    return InvalidArgumentError("table '" + spec.name + "': " + std::to_string(ids.size()) + " ids need " +
                                std::to_string(ids.size() * static_cast<size_t>(spec.dim)) + " floats of rows, not " +
                                std::to_string(rows.size()));
  }
  if (ids.empty()) return OkStatus();
  // Table t's ids alone (the others' lists stay empty); whoever reads them checks them
  // (CheckTableIds: sorted, unique, inside the table).
  read_ids_[table].assign(ids.begin(), ids.end());
  const Status read = local_ ? local_->Read(read_ids_, rows) : sync_->ReadRows(read_ids_, rows);
  read_ids_[table].clear();
  return read;
}

Status FrontendTables::SetGrads(size_t table, std::span<const uint64_t> ids, std::span<const float> grads) {
  RETURN_IF_ERROR(CheckTable(table));
  const TableSpec& spec = specs_[table];
  RETURN_IF_ERROR(CheckTableIds(spec, ids));
  if (grads.size() != ids.size() * static_cast<size_t>(spec.dim)) {
    return InvalidArgumentError("table '" + spec.name + "': the gradients of " + std::to_string(ids.size()) +
                                " rows need " + std::to_string(ids.size() * static_cast<size_t>(spec.dim)) +
                                " floats, not " + std::to_string(grads.size()));
  }
  ids_[table].assign(ids.begin(), ids.end());
  grads_[table].assign(grads.begin(), grads.end());
  return OkStatus();
}

Status FrontendTables::Finish(float lr) {
  if (step_rows() == 0) return OkStatus();
  flat_.clear();
  for (const auto& g : grads_) flat_.insert(flat_.end(), g.begin(), g.end());
  if (local_) return local_->Apply(ids_, flat_, lr);
  step_ = TableStep{.ids = ids_, .rows = {}, .grads = flat_};
  return sync_->SetStepTables(&step_);
}

void FrontendTables::Clear() {
  for (auto& ids : ids_) ids.clear();
  for (auto& g : grads_) g.clear();
  if (sync_ != nullptr) (void)sync_->SetStepTables(nullptr);
}

int64_t FrontendTables::step_rows() const {
  int64_t n = 0;
  for (const auto& ids : ids_) n += static_cast<int64_t>(ids.size());
  return n;
}

}  // namespace gradsync::python
