#include "server/server_checkpoints.h"

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/obs/trace.h"

namespace gradsync {

void ServerCheckpoints::Maybe(bool updated) {
  if (!checkpointer_.enabled() || !shard_.built()) return;
  const double now = SteadyMs() / 1e3;
  if (!checkpointer_.Due(updated, now)) return;
  if (shard_.core->rule().aggregates() && !shard_.core->round().held().empty()) return;  // bsp: only between rounds
  Write(now);
}

double ServerCheckpoints::age_s() const {
  return stats_.last_checkpoint_s < 0 ? -1 : SteadyMs() / 1e3 - stats_.last_checkpoint_s;
}

void ServerCheckpoints::Write(double now_s) {
  const int rank = registration_.rank();
  TraceSpan span("checkpoint", "server", {{"version", static_cast<double>(shard_.core->shard().version())}});
  if (Status s = checkpointer_.Write(rank, [this] { return shard_.core->Snapshot(registration_.Identity()); }, now_s);
      !s.ok()) {
    GRADSYNC_LOG(ERROR) << "server " << rank << ": checkpoint " << checkpointer_.Path(rank)
                        << " failed (training goes on): " << s << "; " << checkpointer_.LastGood(now_s);
  }
  stats_.checkpoints = checkpointer_.written();
  stats_.checkpoint_failures = checkpointer_.failed_since();
  stats_.last_checkpoint_s = checkpointer_.last_written_s();
  stats_.checkpoint_ms_max = checkpointer_.slowest_ms();
}

}  // namespace gradsync
