#include "worker/ps/row_cache.h"

#include <algorithm>
#include <cstring>

namespace gradsync {

RowCache::RowCache(const std::vector<TableSpec>& tables, int num_shards)
    : tables_(tables.size()), num_shards_(num_shards), misses_(tables.size()), miss_plan_(tables, num_shards) {
  for (size_t t = 0; t < tables.size(); ++t) tables_[t].dim = tables[t].dim;
}

void RowCache::set_bound(int bound) {
  bound_ = bound < 0 ? -1 : bound;
  Clear();
}

void RowCache::Clear() {
  for (Table& t : tables_) {
    t.index.clear();
    t.rows.clear();
    t.free.clear();
  }
  expiry_.clear();
}

size_t RowCache::size() const {
  size_t n = 0;
  for (const Table& t : tables_) n += t.index.size();
  return n;
}

void RowCache::Expire(int64_t clock) {
  while (!expiry_.empty() && expiry_.begin()->first < clock) {
    for (const Key& k : expiry_.begin()->second) {
      Table& t = tables_[k.table];
      auto it = t.index.find(k.id);
      // A row pulled again since it was filed here is filed again under its later clock.
      if (it == t.index.end() || it->second.guaranteed != k.guaranteed) continue;
      t.free.push_back(it->second.slot);
      t.index.erase(it);
    }
    expiry_.erase(expiry_.begin());
  }
}

void RowCache::Lookup(int64_t clock, std::span<const std::vector<uint64_t>> ids, FloatSpan rows) {
  for (auto& m : misses_) m.clear();
  miss_at_.clear();
  Expire(clock);
  uint64_t at = 0;
  for (size_t t = 0; t < ids.size() && t < tables_.size(); ++t) {
    Table& table = tables_[t];
    const auto dim = static_cast<uint64_t>(table.dim);
    for (const uint64_t id : ids[t]) {
      const auto it = on() ? table.index.find(id) : table.index.end();
      // Expire dropped every row past the bound; the test keeps the rule in sight all the same.
      if (it != table.index.end() && clock - it->second.guaranteed <= bound_) {
        std::memcpy(rows.data() + at, table.rows.data() + uint64_t{it->second.slot} * dim, dim * sizeof(float));
        ++reads_.cached;
        reads_.saved_bytes += dim * sizeof(float);
        reads_.max_staleness = std::max(reads_.max_staleness, clock - it->second.guaranteed);
      } else {
        misses_[t].push_back(id);
        miss_at_.push_back(at);
      }
      at += dim;
    }
  }
}

void RowCache::Store(uint32_t t, uint64_t id, const float* row, int64_t guaranteed) {
  Table& table = tables_[t];
  const auto dim = static_cast<size_t>(table.dim);
  auto [it, added] = table.index.try_emplace(id);
  if (added) {
    if (!table.free.empty()) {
      it->second.slot = table.free.back();
      table.free.pop_back();
    } else {
      it->second.slot = static_cast<uint32_t>(table.rows.size() / dim);
      table.rows.resize(table.rows.size() + dim);
    }
  }
  it->second.guaranteed = guaranteed;
  std::memcpy(table.rows.data() + size_t{it->second.slot} * dim, row, dim * sizeof(float));
  expiry_[guaranteed + bound_].push_back({t, id, guaranteed});
}

void RowCache::Fill(int64_t clock, FloatSpan rows, const std::function<int64_t(int)>& clock_staleness) {
  const float* from = miss_rows_.data();
  size_t k = 0;
  for (size_t t = 0; t < misses_.size(); ++t) {
    const auto dim = static_cast<size_t>(tables_[t].dim);
    for (const uint64_t id : misses_[t]) {
      std::memcpy(rows.data() + miss_at_[k++], from, dim * sizeof(float));
      const int64_t staleness = std::max<int64_t>(0, clock_staleness(TableShardOf(id, num_shards_)));
      // Kept only while a later read may use it (staleness <= bound: a pull answered within it).
      if (on() && staleness <= bound_) Store(static_cast<uint32_t>(t), id, from, clock - staleness);
      ++reads_.pulled;
      reads_.max_staleness = std::max(reads_.max_staleness, staleness);
      from += dim;
    }
  }
}

Result<StepRows> RowCache::ToPull(int64_t clock, const TablePlan& plan, std::span<const std::vector<uint64_t>> ids,
                                  FloatSpan rows) {
  if (!on()) return StepRows{&plan, rows};
  Lookup(clock, ids, rows);
  if (miss_at_.empty()) return StepRows{};
  RETURN_IF_ERROR(miss_plan_.Set(misses_));
  miss_rows_.resize(miss_plan_.floats());
  return StepRows{&miss_plan_, miss_rows_};
}

void RowCache::Pulled(int64_t clock, const TablePlan& plan, FloatSpan rows,
                      const std::function<int64_t(int)>& clock_staleness) {
  if (on()) {
    if (!miss_at_.empty()) Fill(clock, rows, clock_staleness);
    miss_at_.clear();
    return;
  }
  for (int s = 0; s < num_shards_; ++s) {
    if (plan.ids(s).empty()) continue;
    reads_.pulled += static_cast<int64_t>(plan.ids(s).size());
    reads_.max_staleness = std::max(reads_.max_staleness, std::max<int64_t>(0, clock_staleness(s)));
  }
}

MetricsRow::RowReads RowCache::TakeReads() {
  const MetricsRow::RowReads r = reads_;
  reads_ = {};
  return r;
}

}  // namespace gradsync
