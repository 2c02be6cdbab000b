// ShardCheckpointer: when a shard writes its checkpoint, what goes in it, and reading it back.
//
// DIR/shard-<rank>.ckpt (wire::ShardCheckpoint, protobuf binary) is written atomically (a crash
// leaves the old file or the new) every `every` updates (0: not by count) or `interval_s`
// seconds after the first update since the last one, whichever comes first, and only between
// bsp rounds (the caller says when nothing is held). A failed write is logged by the caller;
// training goes on and the next try comes an interval later. RestoreShard puts a checkpoint back
// into a shard built from its job.
#pragma once

#include <string>

#include "common/status.h"
#include "gradsync.pb.h"
#include "server/consistency.h"
#include "server/kv_shard.h"

namespace gradsync {

class ShardCheckpointer {
 public:
  ShardCheckpointer(std::string dir, int64_t every, double interval_s)
      : dir_(std::move(dir)), every_(every), interval_s_(interval_s) {}

  bool enabled() const { return !dir_.empty(); }
  std::string Path(int rank) const { return dir_ + "/shard-" + std::to_string(rank) + ".ckpt"; }

  // An update was applied (`updated`), or time passed; `now_s` is a monotonic clock. True when
  // a checkpoint is due now.
  bool Due(bool updated, double now_s);
  // Writes the shard's whole state; on success the count starts again, on failure the next try
  // is an interval later. `now_s` as for Due.
  Status Write(int rank, const wire::JobConfig& job, const KvShard& shard, const ConsistencyController& controller,
               double now_s);
  // Reads shard `rank`'s file: kNotFound when there is none, kDataLoss when it is not this
  // shard's checkpoint.
  Result<wire::ShardCheckpoint> Read(int rank) const;

  int64_t written() const { return written_; }
  double slowest_ms() const { return slowest_ms_; }

 private:
  std::string dir_;
  int64_t every_;
  double interval_s_;
  int64_t updates_since_ = 0;
  double first_dirty_s_ = 0;  // when the first update since the last checkpoint happened
  int64_t written_ = 0;
  double slowest_ms_ = 0;
};

// Puts checkpoint `c` into `shard`, built from c.job(): parameters, optimizer state and steps,
// version, schedule step, gradient count. kDataLoss when the checkpoint holds another range, its
// optimizer state was written by another optimizer than the job's, or a size does not fit.
Status RestoreShard(const wire::ShardCheckpoint& c, KvShard* shard);

}  // namespace gradsync
