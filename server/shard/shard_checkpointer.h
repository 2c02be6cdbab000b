// ShardCheckpointer: when a shard writes its checkpoint, what goes in it, and reading it back.
//
// DIR/shard-<rank>.ckpt (wire::ShardCheckpoint, protobuf binary, in a checked file: magic,
// length and CRC32C, common/base/atomic_file.h) is written atomically (a crash leaves the old file or
// the new; a failed write leaves the old file and no temporary one) as soon as the shard is
// initialized, then every `every` updates (0: not by count) or `interval_s` seconds after the
// first update since the last one, whichever comes first, and only between bsp rounds (the
// caller says when nothing is held). Parameters that are not finite are never written (the last
// good checkpoint stays). A failed write is logged by the caller; training goes on and the next
// try comes an interval later. Each checkpoint carries the job's identity (the scheduler's job
// id and the workers' settings fingerprint); Read refuses another job's file, a damaged one and
// one that holds non-finite values. What goes in a checkpoint, and how it is put back, is
// ShardCore's (server/shard/shard_core.h: SnapshotShard, RestoreShard).
#pragma once

#include <functional>
#include <string>

#include "common/base/status.h"
#include "common/ps/consistency.h"
#include "gradsync.pb.h"
#include "server/shard/kv/kv_shard.h"
#include "server/shard/shard_core.h"

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
  // Writes the shard's whole state, as `snapshot` builds it (ShardCore::Snapshot); on success the
  // count starts again, on failure the next try is an interval later. `now_s` as for Due.
  Status Write(int rank, const std::function<wire::ShardCheckpoint()>& snapshot, double now_s);
  // Reads shard `rank`'s file: kNotFound when there is none; kDataLoss, with the file and the
  // reason, when it is damaged, not this shard's, another job's (`table`'s identity), or holds
  // values that are not finite.
  Result<wire::ShardCheckpoint> Read(int rank, const wire::ClusterTable& table) const;

  int64_t written() const { return written_; }
  double slowest_ms() const { return slowest_ms_; }
  // When the last write succeeded (Write's now_s; -1: none has), and the writes failed since.
  double last_written_s() const { return last_written_s_; }
  int64_t failed_since() const { return failed_since_; }
  // "the last good checkpoint is N s old (K write(s) failed since)", or that none was written: what
  // a failed write's warning adds (a disk that stays full pins the checkpoint at an old version).
  std::string LastGood(double now_s) const;

 private:
  std::string dir_;
  int64_t every_;
  double interval_s_;
  int64_t updates_since_ = 0;
  double first_dirty_s_ = 0;  // when the first update since the last checkpoint happened
  int64_t written_ = 0;
  double slowest_ms_ = 0;
  double last_written_s_ = -1;
  int64_t failed_since_ = 0;
};

// kDataLoss naming the first element of the parameters or optimizer state that is not finite.
Status CheckFinite(const wire::ShardCheckpoint& c);

}  // namespace gradsync
