// RowCache: ssp's row cache on the worker side (Petuum Bösen's process cache; ARCHITECTURE.md,
// "Row cache"). A table row pulled at clock c from a shard whose answer held every update before
// clock g (c minus the answer's clock staleness) serves later reads of it at clock c' while
// c' - g <= bound, without asking the shard. The sync sets the bound: ssp's s >= 1; off in bsp
// and ssp(0) (a row would serve only reads at the clock it was pulled at) and in asp (no bound
// to keep a row against). Pushes are never cached.
//
// A read at clock c: ToPull copies the rows held fresh enough into the read's buffer and plans
// the others' pull (a TablePlan of the misses); Pulled takes the pulled misses into the buffer
// and the cache (those a later clock may read: an answer already s behind serves no later clock). A row is dropped once no later read can use it
// (g + bound < the reading clock), so the cache holds the rows of the last bound + 1 clocks at
// most. Every read is counted by the worker itself (reads(): pulled or cached, the bytes saved,
// the largest c' - g), apart from the shards' records. Not thread-safe: one sync's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "common/base/numeric/tensor.h"
#include "common/obs/metrics.h"
#include "common/table/row_index.h"
#include "common/table/table_spec.h"
#include "worker/ps/table_plan.h"

namespace gradsync {

class RowCache {
 public:
  RowCache() = default;
  RowCache(const std::vector<TableSpec>& tables, int num_shards);

  // Rows serve reads while the reading clock minus the lowest clock whose updates they hold is at
  // most `bound`; < 0: off (every read is a miss and nothing is kept). Empties the cache.
  void set_bound(int bound);
  int bound() const { return bound_; }
  bool on() const { return bound_ >= 0; }
  // Forgets every row (a shard restored from a checkpoint or taken over holds other values).
  void Clear();

  // A read at `clock` of the ids `plan` was set from (per table, sorted and unique) into `rows`
  // (plan.floats() of them, table after table, id after id): the rows to pull. Off: every row
  // (`plan` into `rows`). On: the rows held fresh enough are copied into `rows` now, the rest
  // are to pull (into the cache's own buffer; no plan at all when every row was held).
  Result<StepRows> ToPull(int64_t clock, const TablePlan& plan, std::span<const std::vector<uint64_t>> ids,
                          FloatSpan rows);
  // That pull answered, each shard with clock_staleness(shard): its rows into `rows` and the
  // cache, and the read counted.
  void Pulled(int64_t clock, const TablePlan& plan, FloatSpan rows, const std::function<int64_t(int)>& clock_staleness);

  // The reads since the last TakeReads (rows cached and pulled, bytes saved, the largest
  // reading clock minus the lowest clock whose updates the row held), and reset.
  MetricsRow::RowReads TakeReads();
  // Rows held now (every table), and the slots their memory spans (live and dropped, at most
  // twice the live ones past 1024 dropped per table).
  size_t size() const;
  size_t slots() const;

 private:
  // A table's rows held: an open-addressing index (common/table/row_index.h, no node per row) from
  // id to slot; each slot its row, the lowest clock whose updates it holds (kDropped once expired:
  // the slot is dead until the id is pulled again) and its id. Slots are never reused one by one:
  // when the dead outnumber the live, Compact moves the live ones together and rebuilds the index.
  struct Table {
    int dim = 0;
    RowIndex index;
    std::vector<float> rows;            // slot * dim
    std::vector<int64_t> guaranteed;    // per slot
    std::vector<uint64_t> ids;          // per slot
    size_t dead = 0;
  };
  static constexpr int64_t kDropped = INT64_MIN;
  struct Key {
    uint32_t table = 0;
    uint64_t id = 0;
    int64_t guaranteed = 0;  // the entry's when it was filed (a refreshed entry has a later one)
  };
  static void Compact(Table& table);
  // Drops the rows no read at `clock` or later may use.
  void Expire(int64_t clock);
  // The rows held fresh enough at `clock` into `rows`; the others to misses_ and miss_at_.
  void Lookup(int64_t clock, std::span<const std::vector<uint64_t>> ids, FloatSpan rows);
  // The pulled misses (miss_rows_) into `rows` and the cache.
  void Fill(int64_t clock, FloatSpan rows, const std::function<int64_t(int)>& clock_staleness);
  void Store(uint32_t t, uint64_t id, const float* row, int64_t guaranteed);

  std::vector<Table> tables_;
  int num_shards_ = 0;
  int bound_ = -1;
  // By the last clock each row may serve (guaranteed + bound): what Expire drops.
  std::map<int64_t, std::vector<Key>> expiry_;
  std::vector<std::vector<uint64_t>> misses_;  // per table
  std::vector<uint64_t> miss_at_;              // per miss, in order: its row's first float in the read's buffer
  TablePlan miss_plan_;                        // the misses cut per shard
  std::vector<float> miss_rows_;               // their rows as pulled
  std::vector<int64_t> shard_staleness_;       // Fill's: each shard's answer
  MetricsRow::RowReads reads_;
};

}  // namespace gradsync
