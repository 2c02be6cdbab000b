// ServerShard: the shard one server serves, as the server's parts share it: the core (the
// parameters, the consistency rule, the open round, the optimizer states being set), the value
// channels, the job's codecs, the pulls the rule holds back, who speaks for each worker, and the
// backups. A record whose one decision is what a request that comes before INIT is told: the
// lifecycle makes the core, channels and replication once the server is registered
// (ServerLifecycle::Start) and puts the shard back on a restore or a rejoin; the dispatcher, the
// push/pull path and the state service act on it.
#pragma once

#include <memory>

#include "common/base/status.h"
#include "server/channels/shard_channels.h"
#include "server/membership.h"
#include "server/replication/shard_replication.h"
#include "server/requests/parked_requests.h"
#include "server/requests/shard_codecs.h"
#include "server/shard/shard_core.h"

namespace gradsync {

struct ServerShard {
  // Initialized: worker 0's INIT, or a restore, built the shard.
  bool built() const { return core && core->built(); }
  // The refusal of a request that needs the shard before INIT (or a restore) built it.
  static Status NotBuilt() { return FailedPreconditionError("not initialized (worker 0 sends INIT first)"); }

  ParkedRequests parked;  // pulls the rule holds back, with their messages
  std::unique_ptr<ShardCore> core;  // the shard, its consistency rule and its open round (made once registered)
  Membership membership;  // who speaks for each worker, what a restore held, the scheduler's news
  ShardCodecs codecs;  // the job's push codec and --compress-pull's encoder
  std::unique_ptr<ShardChannels> channels;  // ZeroMQ, shared-memory lanes, data channels (made once registered)
  // Replication (--replicas > 1): this shard's backups, and the copies held here of others.
  std::unique_ptr<ShardReplication> replication;
};

}  // namespace gradsync
