// ServerCheckpoints: when a shard server writes its shard's checkpoint (at INIT, after an update
// or from the loop once --checkpoint-interval passed, only between bsp rounds), the write itself
// (a failed one is logged and training goes on), reading it back for a restore, and the counts
// the summary shows. What a checkpoint holds is ShardCore's; the file is ShardCheckpointer's.
#pragma once

#include <string>

#include "common/base/status.h"
#include "server/server_options.h"
#include "server/server_registration.h"
#include "server/server_shard.h"
#include "server/shard/shard_checkpointer.h"

namespace gradsync {

class ServerCheckpoints {
 public:
  ServerCheckpoints(const ServerCheckpointOptions& options, ServerShard& shard, const ServerRegistration& registration,
                    RecoveryStats& stats)
      : checkpointer_(options.dir, options.every, options.interval_s),
        shard_(shard),
        registration_(registration),
        stats_(stats) {}

  bool enabled() const { return checkpointer_.enabled(); }
  // Written when due: after an update (`updated`), or from the loop once the interval passed.
  void Maybe(bool updated);
  // Written now (`now_s`: SteadyMs() / 1e3).
  void Write(double now_s);
  // This shard's checkpoint, read back and checked against the job (ShardCheckpointer::Read).
  Result<wire::ShardCheckpoint> Read() const { return checkpointer_.Read(registration_.rank(), registration_.table()); }
  std::string Path() const { return checkpointer_.Path(registration_.rank()); }
  // Seconds since the last good checkpoint was written; -1 when none was (or no --checkpoint-dir).
  double age_s() const;

 private:
  ShardCheckpointer checkpointer_;
  ServerShard& shard_;
  const ServerRegistration& registration_;
  RecoveryStats& stats_;
};

}  // namespace gradsync
