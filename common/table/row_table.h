// RowTable: one shard's part of an embedding table (common/table/table_spec.h): the rows whose ids
// hash to this shard, created when a gradient first touches them, and their per-row optimizer
// state. Its parts: RowIndex (id -> slot), RowStore (the slots' values, state and step counts) and
// RowRound (a bsp round's gradients summed per id until the round is applied once).
//
// Reads never create a row: a row not stored answers its initial value (InitRow), which is what it
// would hold if it had been created then. So a shard's memory follows the rows gradients touched,
// and a pull of a million cold ids costs no memory. A gradient that would make the shard hold more
// than the table's max_rows_per_shard rows is refused whole (kResourceExhausted naming the table,
// the shard and the bound): nothing of it is applied or summed.
//
// Scales, as the dense shard's (server/shard/kv/kv_shard.h): one worker's push applied at once
// (ssp, asp) moves a row about 1/N of a step: SGD steps on g / N, Adagrad and Adam on g at rate
// lr / N (their steps do not follow g's scale); a bsp round applies the mean of its gradients once.
// A row no push of a round touched is not stepped (lazy: Adam's t and moments, Adagrad's sum stay).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/optim/row_optimizer.h"
#include "common/table/row_index.h"
#include "common/table/row_store.h"
#include "common/table/table_spec.h"

namespace gradsync {

// A bsp round's row gradients, summed per id. Ids enter in the order they first came (reserved
// when a push is held, or added), and each id's sum is added to in the order the gradients are
// added (the shard adds its held pushes in worker-rank order, so a round's sums are the same bits
// whatever order the pushes came in).
class RowRound {
 public:
  explicit RowRound(int dim) : dim_(dim) {}

  size_t size() const { return ids_.size(); }
  bool contains(uint64_t id) const { return index_.Find(id) != RowIndex::kAbsent; }
  // Enters `ids` with nothing added yet (a held push's rows, counted against the bound).
  void Reserve(std::span<const uint64_t> ids);
  // Adds `grads` (ids.size() rows) to the sums.
  void Add(std::span<const uint64_t> ids, const float* grads);
  uint64_t id(size_t i) const { return ids_[i]; }
  // Whether any gradient was added for entry i (a reserved id whose push was dropped has none).
  bool added(size_t i) const { return added_[i] != 0; }
  const float* sum(size_t i) const { return sums_.data() + i * static_cast<size_t>(dim_); }
  void Clear();
  uint64_t bytes() const {
    return index_.bytes() + ids_.capacity() * sizeof(uint64_t) + sums_.capacity() * sizeof(float) +
           added_.capacity();
  }

 private:
  uint32_t Enter(uint64_t id);

  int dim_;
  RowIndex index_;
  std::vector<uint64_t> ids_;
  std::vector<float> sums_;
  std::vector<uint8_t> added_;
};

// A table shard's rows as a checkpoint or a replica carries them: ids ascending, their values
// (dim each), optimizer state (state_floats each) and step counts (one each when the optimizer
// counts steps, else none).
struct TableRows {
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<float> state;
  std::vector<int64_t> steps;
};

class RowTable {
 public:
  // The part of `spec` that shard `shard` of `num_shards` holds (spec valid: ValidateTableSpec).
  RowTable(TableSpec spec, int shard, int num_shards);

  const TableSpec& spec() const { return spec_; }
  int64_t rows() const { return store_.size(); }
  // The memory the rows, their index and the open round hold, in bytes.
  uint64_t bytes() const { return store_.bytes() + index_.bytes() + round_.bytes(); }

  // What a request may name here: CheckTableIds, and every id this shard's (TableShardOf).
  // kInvalidArgument naming the table and the first id that is not.
  Status CheckIds(std::span<const uint64_t> ids) const;
  // The rows of `ids` (ids.size() * dim floats to `out`): stored, or their initial value.
  void Read(std::span<const uint64_t> ids, float* out) const;
  // Applies one worker's row gradients now (ssp, asp) at lr * lr_scale, each gradient times
  // grad_scale (KvShard's push scales). kResourceExhausted, and nothing changes, when the rows it
  // would create pass the bound.
  Status Apply(std::span<const uint64_t> ids, const float* grads, float lr, float grad_scale,
               float lr_scale);
  // Whether the rows `ids` would create fit under the bound, with those the open round will create
  // (with_round: bsp) or not: kResourceExhausted naming the table, the shard and the bound.
  Status CheckRoom(std::span<const uint64_t> ids, bool with_round) const;
  // A push held for the round (bsp): its rows are checked against the bound with the round's
  // (CheckRoom) and entered in the round, so that the pushes held with it count them; nothing is
  // summed yet. kResourceExhausted, and nothing changes, past the bound.
  Status Reserve(std::span<const uint64_t> ids);
  // Adds one worker's row gradients to the round (bsp). kResourceExhausted, and nothing is added,
  // when the rows the round would create pass the bound (none do once Reserve took them).
  Status Accumulate(std::span<const uint64_t> ids, const float* grads);
  // Applies the mean of the round's sums over `count` gradients at lr, once per row a gradient was
  // added for (a reserved row whose push was dropped is neither created nor stepped), and empties
  // it.
  void ApplyAccumulated(int count, float lr);
  size_t round_rows() const { return round_.size(); }
  // Forgets the round's sums (the shard rebuilt).
  void DropRound() {
    round_.Clear();
    round_new_rows_ = 0;
  }

  // Every stored row, ids ascending.
  TableRows Save() const;
  // Replaces every row with `rows` (the round is emptied). kDataLoss, and nothing changes, when a
  // size does not fit this table, an id is not sorted, unique, inside the table and this shard's,
  // a value or state is not one this table could hold, or there are more rows than the bound.
  Status Restore(const TableRows& rows);

 private:
  uint32_t Create(uint64_t id);
  // Before handling ids[i]: prefetches a later id's index probe and a nearer one's row.
  void Prefetch(std::span<const uint64_t> ids, size_t i) const;

  TableSpec spec_;
  int shard_;
  int num_shards_;
  RowOptimizer optimizer_;
  RowIndex index_;
  RowStore store_;
  RowRound round_;
  int64_t round_new_rows_ = 0;  // rows of the open round not stored yet
};

// Rows held over several tables (a shard's, a process's), and their memory in bytes.
int64_t TotalRows(std::span<const RowTable> tables);
uint64_t TotalBytes(std::span<const RowTable> tables);

}  // namespace gradsync
