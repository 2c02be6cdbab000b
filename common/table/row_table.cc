#include "common/table/row_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gradsync {

uint32_t RowRound::Enter(uint64_t id) {
  uint32_t at = index_.Find(id);
  if (at != RowIndex::kAbsent) return at;
  at = static_cast<uint32_t>(ids_.size());
  index_.Insert(id, at);
  ids_.push_back(id);
  sums_.resize(sums_.size() + static_cast<size_t>(dim_), 0.0f);
  added_.push_back(0);
  return at;
}

void RowRound::Reserve(std::span<const uint64_t> ids) {
  for (uint64_t id : ids) Enter(id);
}

void RowRound::Add(std::span<const uint64_t> ids, const float* grads) {
  const size_t dim = static_cast<size_t>(dim_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* g = grads + i * dim;
    const uint32_t at = Enter(ids[i]);
    float* sum = sums_.data() + static_cast<size_t>(at) * dim;
    if (added_[at] == 0) {
      std::memcpy(sum, g, dim * sizeof(float));  // the first gradient is the sum, bit for bit
      added_[at] = 1;
      continue;
    }
    for (size_t j = 0; j < dim; ++j) sum[j] += g[j];
  }
}

void RowRound::Clear() {
  index_.Clear();
  ids_.clear();
  sums_.clear();
  added_.clear();
}

RowTable::RowTable(TableSpec spec, int shard, int num_shards)
    : spec_(std::move(spec)),
      shard_(shard),
      num_shards_(num_shards),
      optimizer_(spec_.optimizer, spec_.dim),
      store_(spec_.dim, optimizer_.state_floats(), optimizer_.counts_steps()),
      round_(spec_.dim) {}

Status RowTable::CheckIds(std::span<const uint64_t> ids) const {
  RETURN_IF_ERROR(CheckTableIds(spec_, ids));
  if (num_shards_ > 1) {
    for (uint64_t id : ids) {
      if (TableShardOf(id, num_shards_) != shard_) {
        return InvalidArgumentError("table '" + spec_.name + "': id " + std::to_string(id) +
                                    " belongs to shard " +
                                    std::to_string(TableShardOf(id, num_shards_)) + ", not shard " +
                                    std::to_string(shard_));
      }
    }
  }
  return OkStatus();
}

void RowTable::Prefetch(std::span<const uint64_t> ids, size_t i) const {
  // Two stages ahead of the row at i: the index probe of the row kIndexAhead on, and the values
  // (and optimizer state) of the row kRowAhead on, whose probe the first stage brought in.
  constexpr size_t kIndexAhead = 16, kRowAhead = 4;
  if (i + kIndexAhead < ids.size()) index_.Prefetch(ids[i + kIndexAhead]);
  if (i + kRowAhead < ids.size()) {
    const uint32_t slot = index_.Find(ids[i + kRowAhead]);
    if (slot != RowIndex::kAbsent) {
      const float* row = store_.values(slot);
      __builtin_prefetch(row);
      __builtin_prefetch(row + 16);  // dim 32 and more, and the state behind the values, span lines
    }
  }
}

void RowTable::Read(std::span<const uint64_t> ids, float* out) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    Prefetch(ids, i);
    const uint32_t slot = index_.Find(ids[i]);
    if (slot == RowIndex::kAbsent) {
      InitRow(spec_, ids[i], out + i * dim);
    } else {
      std::memcpy(out + i * dim, store_.values(slot), dim * sizeof(float));
    }
  }
}

Status RowTable::CheckRoom(std::span<const uint64_t> ids, bool with_round) const {
  int64_t created = with_round ? round_new_rows_ : 0;
  // Far from the bound (every id new would still fit) no row needs looking up: the check then
  // costs nothing beside the push it guards, which looks each id up once more to apply it.
  if (rows() + created + static_cast<int64_t>(ids.size()) <= spec_.max_rows_per_shard) return OkStatus();
  for (uint64_t id : ids) {
    if (index_.Find(id) == RowIndex::kAbsent && !(with_round && round_.contains(id))) ++created;
  }
  if (rows() + created > spec_.max_rows_per_shard) {
    return ResourceExhaustedError("table '" + spec_.name + "' on shard " + std::to_string(shard_) +
                                  ": " + std::to_string(rows() + created) +
                                  " rows would pass its bound of " +
                                  std::to_string(spec_.max_rows_per_shard) + " rows per shard");
  }
  return OkStatus();
}

uint32_t RowTable::Create(uint64_t id) {
  const uint32_t slot = store_.Add();
  InitRow(spec_, id, store_.values(slot));
  optimizer_.InitState(store_.state(slot));
  index_.Insert(id, slot);
  return slot;
}

Status RowTable::Apply(std::span<const uint64_t> ids, const float* grads, float lr,
                       float grad_scale, float lr_scale) {
  RETURN_IF_ERROR(CheckRoom(ids, /*with_round=*/false));
  const size_t dim = static_cast<size_t>(spec_.dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    Prefetch(ids, i);
    uint32_t slot = index_.Find(ids[i]);
    if (slot == RowIndex::kAbsent) slot = Create(ids[i]);
    optimizer_.Step(store_.values(slot), store_.state(slot), store_.steps(slot), grads + i * dim,
                    lr * lr_scale, grad_scale);
  }
  return OkStatus();
}

Status RowTable::Reserve(std::span<const uint64_t> ids) {
  RETURN_IF_ERROR(CheckRoom(ids, /*with_round=*/true));
  for (uint64_t id : ids) {
    if (index_.Find(id) == RowIndex::kAbsent && !round_.contains(id)) ++round_new_rows_;
  }
  round_.Reserve(ids);
  return OkStatus();
}

Status RowTable::Accumulate(std::span<const uint64_t> ids, const float* grads) {
  RETURN_IF_ERROR(CheckRoom(ids, /*with_round=*/true));
  for (uint64_t id : ids) {
    if (index_.Find(id) == RowIndex::kAbsent && !round_.contains(id)) ++round_new_rows_;
  }
  round_.Add(ids, grads);
  return OkStatus();
}

void RowTable::ApplyAccumulated(int count, float lr) {
  const float scale = count > 1 ? 1.0f / static_cast<float>(count) : 1.0f;
  for (size_t i = 0; i < round_.size(); ++i) {
    if (!round_.added(i)) continue;
    const uint64_t id = round_.id(i);
    uint32_t slot = index_.Find(id);
    if (slot == RowIndex::kAbsent) slot = Create(id);
    optimizer_.Step(store_.values(slot), store_.state(slot), store_.steps(slot), round_.sum(i), lr,
                    scale);
  }
  round_.Clear();
  round_new_rows_ = 0;
}

TableRows RowTable::Save() const {
  TableRows out;
  const size_t n = store_.size();
  std::vector<std::pair<uint64_t, uint32_t>> order;
  order.reserve(n);
  index_.ForEach([&](uint64_t id, uint32_t slot) { order.emplace_back(id, slot); });
  std::sort(order.begin(), order.end());
  const size_t dim = static_cast<size_t>(spec_.dim);
  const size_t state = static_cast<size_t>(optimizer_.state_floats());
  out.ids.reserve(n);
  out.values.reserve(n * dim);
  out.state.reserve(n * state);
  for (const auto& [id, slot] : order) {
    out.ids.push_back(id);
    out.values.insert(out.values.end(), store_.values(slot), store_.values(slot) + dim);
    out.state.insert(out.state.end(), store_.state(slot), store_.state(slot) + state);
    if (optimizer_.counts_steps()) out.steps.push_back(store_.steps_of(slot));
  }
  return out;
}

Status RowTable::Restore(const TableRows& rows) {
  const std::string table = "table '" + spec_.name + "' on shard " + std::to_string(shard_) + ": ";
  const size_t n = rows.ids.size();
  const size_t dim = static_cast<size_t>(spec_.dim);
  const size_t state = static_cast<size_t>(optimizer_.state_floats());
  if (rows.values.size() != n * dim || rows.state.size() != n * state ||
      rows.steps.size() != (optimizer_.counts_steps() ? n : 0)) {
    return DataLossError(table + "the saved rows' sizes do not fit " + std::to_string(n) +
                         " rows of dim " + std::to_string(dim) + " with " +
                         RowOptimizerKindName(spec_.optimizer.kind) + " state");
  }
  if (static_cast<int64_t>(n) > spec_.max_rows_per_shard) {
    return DataLossError(table + std::to_string(n) + " saved rows pass the bound of " +
                         std::to_string(spec_.max_rows_per_shard));
  }
  if (Status st = CheckIds(rows.ids); !st.ok())
    return DataLossError(table + "saved ids: " + st.message());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < dim; ++j) {
      if (!std::isfinite(rows.values[i * dim + j])) {
        return DataLossError(table + "saved row " + std::to_string(rows.ids[i]) +
                             " holds a value that is not finite");
      }
    }
    const std::span<const float> s(rows.state.data() + i * state, state);
    if (Status st = optimizer_.CheckState(s, optimizer_.counts_steps() ? rows.steps[i] : 0);
        !st.ok()) {
      return DataLossError(table + "saved row " + std::to_string(rows.ids[i]) + ": " +
                           st.message());
    }
  }
  index_.Clear();
  store_.Clear();
  round_.Clear();
  round_new_rows_ = 0;
  index_.Reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t slot = store_.Add();
    std::memcpy(store_.values(slot), rows.values.data() + i * dim, dim * sizeof(float));
    if (state > 0)
      std::memcpy(store_.state(slot), rows.state.data() + i * state, state * sizeof(float));
    if (int64_t* steps = store_.steps(slot)) *steps = rows.steps[i];
    index_.Insert(rows.ids[i], slot);
  }
  return OkStatus();
}

int64_t TotalRows(std::span<const RowTable> tables) {
  int64_t n = 0;
  for (const RowTable& t : tables) n += t.rows();
  return n;
}

uint64_t TotalBytes(std::span<const RowTable> tables) {
  uint64_t n = 0;
  for (const RowTable& t : tables) n += t.bytes();
  return n;
}

}  // namespace gradsync
