// Server: one parameter-server shard process (gradsync-server --role=server).
//
// Owns a ROUTER data socket that workers connect to, a SchedulerClient, a ConsistencyController
// and (after worker 0's INIT) a KvShard. One thread runs the request loop: every message is
// validated (structure by the transport; sender, clocks, versions and ranges here) before it
// touches the shard, and a bad one is answered with an ERROR (or dropped when it cannot be
// answered) and counted; it never stops the loop or changes parameters. Pulls that the
// consistency rule cannot answer yet are parked and answered as soon as it can. Dead workers
// (from the scheduler) leave the live set; a worker the scheduler announces as rejoined JOINs and
// goes on at the clock the shard suggests. A worker that ended training (TRAINING_ENDED) stays
// live, and a pull that needs a push it will never make is answered at once with an error naming
// it (kFailedPrecondition); one that joined leaves the live set as a dead worker does, but its
// pulls are still answered. With a checkpoint directory the shard's state is
// written atomically every K updates or T seconds; a restarted shard that rejoins the job
// restores it, and each worker JOINs with the clock it has reached: the pushes it had made past
// the checkpoint are lost, counted in stats().recovery.lost_updates and logged. The loop ends on the
// scheduler's SHUTDOWN, when the scheduler is lost, or on Stop(). The data socket accepts control
// messages only until a worker has told the scheduler the job's largest message (from its model's
// layout); then it is bound again with that limit, before any worker connects.
//
// Server is the composition root of its parts, each with its own responsibility:
// ServerRegistration (its place in the job: the scheduler link, rank and table), ServerShard (the
// shard the parts share), ErrorReplies (refusals), ServerCheckpoints (when the shard is written and
// read back), StateService (STATE_PULL / STATE_PUSH), PushPullService (PUSH, PULL and
// CHANNEL_ATTACH), ServerLifecycle (start, INIT and JOIN, restores, takeovers, rejoining after a
// pause, the scheduler's news, the end) and RequestDispatcher (messages decoded and routed). Run()
// is its loop: the dispatcher's pass over what came in, then the lifecycle's.
//
// Run() and everything but Stop() belong to one thread; read the stats after Run() returns.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "server/requests/error_replies.h"
#include "server/requests/push_pull_service.h"
#include "server/requests/request_dispatcher.h"
#include "server/requests/state_service.h"
#include "server/server_checkpoints.h"
#include "server/server_lifecycle.h"
#include "server/server_options.h"
#include "server/server_registration.h"
#include "server/server_shard.h"
#include "server/shard/transform/delay_compensation.h"

namespace gradsync {

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(TransportContext& ctx, const ServerOptions& options);

  uint16_t port() const { return socket_.port(); }
  Status Run();
  void Stop() { stop_.store(true); }

  int rank() const { return registration_.rank(); }
  const ServerStats& stats() const { return stats_; }
  // Seconds since the last good checkpoint was written; -1 when none was (or no --checkpoint-dir).
  double checkpoint_age_s() const { return checkpoints_.age_s(); }
  // Shards of dead servers this one took over from its copies (each ran its own loop; they have
  // ended when Run returns).
  std::vector<const Server*> adopted() const { return lifecycle_.adopted(); }
  const std::vector<PullRecord>& pull_log() const { return push_pull_.pull_log(); }
  // The shard's parameters (empty before INIT).
  std::vector<float> params() const;
  // The shard's rows of the job's embedding tables (a checkpoint's form; empty before INIT), and
  // how many it holds and their memory (bytes).
  std::vector<wire::TableRowsCheckpoint> table_rows() const;
  std::pair<int64_t, uint64_t> table_size() const;
  // The shard's version: the gradients applied to it since INIT (0 before INIT).
  int64_t version() const { return shard_.built() ? shard_.core->shard().version() : 0; }
  // Delay compensation (the job's, ssp/asp), or null: its memory and its counts.
  const DelayCompensation* delay_compensation() const {
    return shard_.built() ? AsDelayCompensation(shard_.core->transform()) : nullptr;
  }

 private:
  Server(TransportContext& ctx, ServerOptions options, Socket socket);

  // The summary's last counts: the data socket's and channels' traffic, the channels' and the
  // replication's counts.
  void Finish();

  ServerOptions options_;
  Socket socket_;
  std::atomic<bool> stop_{false};
  ServerStats stats_;
  ServerRegistration registration_;
  ServerShard shard_;
  ErrorReplies replies_;
  ServerCheckpoints checkpoints_;
  StateService state_;
  PushPullService push_pull_;
  ServerLifecycle lifecycle_;
  RequestDispatcher dispatcher_;
};

}  // namespace gradsync
