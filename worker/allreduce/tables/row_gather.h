// RowGather: a model's embedding tables in --mode=allreduce (ARCHITECTURE.md, "Tables"). Every
// worker keeps a replica of every table (LocalTables: rows created on their first gradient at the
// seeded InitRow value, so the replicas agree without a broadcast, and memory grows with the rows
// touched, never with the id space). A step's rows are read from the replica; its row gradients
// are all-gathered as (ids, rows) over the job's Collective, as Horovod and DDP exchange sparse
// gradients, summed per id in rank order and their mean over the workers applied once with the
// table's row optimizer: what a bsp shard does with a round's pushes, so N workers with batch b
// step the rows as one process with batch N*b. Every replica adds the same bytes in the same order
// and applies the same round, so the replicas stay bit for bit the same.
//
// A worker's message (one AllGather a step, every worker, rows or none): per table in order, the
// row count (uint64), the ids (uint64 each, sorted and unique), then the rows' gradients (dim
// floats each): 8 bytes a table plus rows * (8 + 4 * dim). A message that does not parse to
// exactly that, or whose ids a table cannot hold, fails the step with kDataLoss naming the rank
// and the table, and nothing of the round is applied. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "allreduce/collective.h"
#include "common/base/status.h"
#include "common/table/table_spec.h"
#include "worker/sync/local_tables.h"

namespace gradsync {

class RowGather {
 public:
  explicit RowGather(const std::vector<TableSpec>& specs) : specs_(specs), replica_(specs) {}

  // The rows of `ids` (per table, sorted and unique) as this replica holds them (LocalTables::Read).
  Status Read(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) const {
    return replica_.Read(ids, rows);
  }
  // Whether every worker's tables are this one's (dim, id space, initial values and their seed,
  // bound, row optimizer): the replicas agree on rows never stored only if they are, so Start
  // checks it with one all-gather. kFailedPrecondition naming the first rank and table that differ.
  Status CheckSameTables(Collective& collective);
  // This worker's row gradients (ids per table, grads laid out as Read's rows; no ids: none)
  // all-gathered over `collective` and merged (Merge). Every worker calls it once a step.
  Status Gather(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads,
                Collective& collective);
  // This worker's message for `ids` and `grads` into *out (its capacity kept).
  Status Encode(std::span<const std::vector<uint64_t>> ids, std::span<const float> grads,
                std::vector<std::byte>* out) const;
  // Every worker's message, in rank order, summed per id into the round (LocalTables::Accumulate).
  // kDataLoss naming the rank and the table for a message that does not parse or names ids the
  // table cannot hold; kResourceExhausted past a table's bound. On failure the round is dropped.
  Status Merge(std::span<const std::vector<std::byte>> parts);
  // Applies the merged round's mean over its workers once per row at `lr`, and empties it.
  void Apply(float lr);
  // Forgets a merged round (the step failed after the gather).
  void Drop();

  const LocalTables& replica() const { return replica_; }

 private:
  // Worker `rank`'s message into ids_ and grads_.
  Status Decode(int rank, std::span<const std::byte> part);

  std::vector<TableSpec> specs_;
  LocalTables replica_;
  int round_workers_ = 0;                      // the workers merged into the open round
  std::vector<std::byte> mine_;                // this worker's message
  std::vector<std::vector<std::byte>> parts_;  // every worker's, from the all-gather
  std::vector<std::vector<uint64_t>> ids_;     // one worker's ids, decoded
  std::vector<float> grads_;                   // and its rows' gradients
};

}  // namespace gradsync
