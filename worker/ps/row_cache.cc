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
    t.index.Clear();
    t.rows.clear();
    t.guaranteed.clear();
    t.ids.clear();
    t.dead = 0;
  }
  expiry_.clear();
}

size_t RowCache::size() const {
  size_t n = 0;
  for (const Table& t : tables_) n += t.ids.size() - t.dead;
  return n;
}

size_t RowCache::slots() const {
  size_t n = 0;
  for (const Table& t : tables_) n += t.ids.size();
  return n;
}

void RowCache::Compact(Table& t) {
  const auto dim = static_cast<size_t>(t.dim);
  t.index.Clear();
  size_t live = 0;
  for (size_t slot = 0; slot < t.ids.size(); ++slot) {
    if (t.guaranteed[slot] == kDropped) continue;
    if (live != slot) {
      std::memcpy(t.rows.data() + live * dim, t.rows.data() + slot * dim, dim * sizeof(float));
      t.guaranteed[live] = t.guaranteed[slot];
      t.ids[live] = t.ids[slot];
    }
    t.index.Insert(t.ids[live], static_cast<uint32_t>(live));
    ++live;
  }
  t.rows.resize(live * dim);
  t.guaranteed.resize(live);
  t.ids.resize(live);
  t.dead = 0;
}

void RowCache::Expire(int64_t clock) {
  while (!expiry_.empty() && expiry_.begin()->first < clock) {
    for (const Key& k : expiry_.begin()->second) {
      Table& t = tables_[k.table];
      const uint32_t slot = t.index.Find(k.id);
      // A row pulled again since it was filed here is filed again under its later clock.
      if (slot == RowIndex::kAbsent || t.guaranteed[slot] != k.guaranteed) continue;
      t.guaranteed[slot] = kDropped;
      ++t.dead;
    }
    expiry_.erase(expiry_.begin());
  }
  for (Table& t : tables_) {
    if (t.dead > 1024 && t.dead * 2 > t.ids.size()) Compact(t);
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
      const uint32_t slot = table.index.Find(id);
      const int64_t g = slot == RowIndex::kAbsent ? kDropped : table.guaranteed[slot];
      // Expire dropped every row past the bound; the test keeps the rule in sight all the same.
      if (g != kDropped && clock - g <= bound_) {
        std::memcpy(rows.data() + at, table.rows.data() + uint64_t{slot} * dim, dim * sizeof(float));
        ++reads_.cached;
        reads_.saved_bytes += dim * sizeof(float);
        reads_.max_staleness = std::max(reads_.max_staleness, clock - g);
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
  uint32_t slot = table.index.Find(id);
  if (slot == RowIndex::kAbsent) {
    slot = static_cast<uint32_t>(table.ids.size());
    table.rows.resize(table.rows.size() + dim);
    table.guaranteed.push_back(guaranteed);
    table.ids.push_back(id);
    table.index.Insert(id, slot);
  } else {
    if (table.guaranteed[slot] == kDropped) --table.dead;
    table.guaranteed[slot] = guaranteed;
  }
  std::memcpy(table.rows.data() + size_t{slot} * dim, row, dim * sizeof(float));
  expiry_[guaranteed + bound_].push_back({t, id, guaranteed});
}

void RowCache::Fill(int64_t clock, FloatSpan rows, const std::function<int64_t(int)>& clock_staleness) {
  shard_staleness_.resize(static_cast<size_t>(num_shards_));
  for (int s = 0; s < num_shards_; ++s) shard_staleness_[static_cast<size_t>(s)] = std::max<int64_t>(0, clock_staleness(s));
  const float* from = miss_rows_.data();
  size_t k = 0;
  for (size_t t = 0; t < misses_.size(); ++t) {
    const auto dim = static_cast<size_t>(tables_[t].dim);
    for (const uint64_t id : misses_[t]) {
      std::memcpy(rows.data() + miss_at_[k++], from, dim * sizeof(float));
      const int64_t staleness = shard_staleness_[static_cast<size_t>(TableShardOf(id, num_shards_))];
      // Kept only while a later clock's read may use it: an answer already as stale as the bound
      // could serve this clock's reads alone, which read it once.
      if (on() && staleness < bound_) Store(static_cast<uint32_t>(t), id, from, clock - staleness);
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
