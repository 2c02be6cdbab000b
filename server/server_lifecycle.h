// ServerLifecycle: a shard server's life in the job and its recovery. Start registers
// (ServerRegistration), makes the shard's core, channels and replication, restores a restarted
// shard (from a backup's copy or its checkpoint; a standby keeps copies only) and announces it
// listens. Worker 0's INIT builds the shard (and the job's codecs) and writes the first
// checkpoint; a (re)joining worker's JOIN says where it goes on, and a restored shard counts the
// pushes it lost of it. Each pass of the loop it polls the backups, writes a checkpoint when due
// and handles the scheduler's news: dead workers leave the live set; a rejoined worker may JOIN; a
// worker that ended training is recorded (WorkerClocks::EndAt: pulls that need its
// pushes fail at once), and one that joined leaves the rule; a dead server whose first live backup
// this is gets taken over (a new Server in this process takes its rank, from the copy); declared
// dead after a pause, it registers again and serves its shard as it is (or, its shard taken over
// meanwhile, becomes a standby). Finish ends the link and waits for the shards it took over.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"
#include "server/requests/push_pull_service.h"
#include "server/server_checkpoints.h"
#include "server/server_options.h"
#include "server/server_registration.h"
#include "server/server_shard.h"

namespace gradsync {

class Server;

class ServerLifecycle {
 public:
  ServerLifecycle(TransportContext& ctx, const ServerOptions& options, Socket& socket, const std::atomic<bool>& stop,
                  ServerRegistration& registration, ServerShard& shard, ServerCheckpoints& checkpoints,
                  PushPullService& push_pull, RecoveryStats& stats);
  ~ServerLifecycle();

  // Registered, restored if it rejoined, listening.
  Status Start();
  // The loop's pass after the requests: the backups polled, a checkpoint when due, the
  // scheduler's news (a value: the loop ends with it).
  std::optional<Status> Poll();
  // The link ended (the scheduler sees this shard leave) and the shards taken over ended.
  void Finish();

  Status HandleInit(const PsRequest& r, const Message& m);
  // JOIN: a (re)joining worker asks where to start (clock -1) or says where it goes on.
  Status HandleJoin(const PsRequest& r, const Message& m);

  // Shards of dead servers this one took over from its copies (each ran its own loop; they have
  // ended when Run returns).
  std::vector<const Server*> adopted() const;

 private:
  struct Adoption;

  // Builds the shard (and the job's codecs) for `job`; INIT and a restore share it.
  // (from: a checkpoint or a backup's copy to restore, else a fresh shard from INIT's values.)
  Status BuildShard(const wire::JobConfig& job, const wire::ShardCheckpoint* from = nullptr);
  // A shard built from a checkpoint's job and put back in its state (a file's or a backup's copy).
  Status RestoreState(const wire::ShardCheckpoint& c);
  Status RestoreCheckpoint();
  Status RestoreFromCopy();
  std::optional<Status> OnSchedulerNews();
  void OnMembership();
  // A dead server whose shard this one holds a whole copy of, and whose first live backup this
  // is: a new Server in this process takes its rank, from the copy.
  void MaybeAdopt(int dead_server);
  // Declared dead (paused past the heartbeat timeout): registers again and, given its rank
  // back, serves its shard as it is; workers go on from there.
  Status Rejoin();

  TransportContext& ctx_;
  const ServerOptions& options_;
  Socket& socket_;
  const std::atomic<bool>& stop_;
  ServerRegistration& registration_;
  ServerShard& shard_;
  ServerCheckpoints& checkpoints_;
  PushPullService& push_pull_;
  RecoveryStats& stats_;
  std::shared_ptr<Colocated> colocated_;
  std::vector<std::unique_ptr<Adoption>> adopted_;
};

}  // namespace gradsync
