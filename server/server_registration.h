// ServerRegistration: a shard server's place in the job. It registers with the scheduler (again
// after a pause that got it declared dead), keeps the link (SchedulerClient: heartbeats, the
// table, the news), and knows the rank and cluster table it was given, hence whether it is a
// standby. It raises the data socket's message limit to the job's and tells the scheduler the
// shard listens (LISTENING). Everything here belongs to the server's loop thread.
#pragma once

#include <cstdint>
#include <memory>

#include "common/base/status.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "server/server_options.h"
#include "server/shard/shard_core.h"

namespace gradsync {

class ServerRegistration {
 public:
  ServerRegistration(TransportContext& ctx, const ServerOptions& options, Socket& socket, RequestStats& stats)
      : ctx_(ctx), options_(options), socket_(socket), stats_(stats) {}

  // Registers (a previous link, declared dead, stops first) and takes the rank and table it is
  // given. What strangers send the data socket meanwhile is read and dropped (counted rejected).
  Status Register();
  // The job's message limit (the scheduler's table, once a worker has said): raised on the data
  // socket, then the scheduler hears that this shard accepts it (LISTENING), and only then lets
  // workers connect (or announces this restarted shard).
  Status ApplyMessageLimit();
  // The scheduler's table asks for a larger limit than the one last announced.
  bool LimitRaised() const { return static_cast<int64_t>(scheduler_->table().max_message_bytes()) > listening_; }
  // Stops the link (its heartbeats: the scheduler sees this shard leave).
  void Leave() { scheduler_.reset(); }

  int rank() const { return rank_; }
  const wire::ClusterTable& table() const { return table_; }
  SchedulerClient& scheduler() { return *scheduler_; }
  const SchedulerClient& scheduler() const { return *scheduler_; }
  ShardIdentity Identity() const { return IdentityOf(rank_, table_); }
  // A standby: a server that came back after a backup took its shard over (copies only).
  bool standby() const { return rank_ >= table_.servers_size(); }

 private:
  TransportContext& ctx_;
  const ServerOptions& options_;
  Socket& socket_;
  RequestStats& stats_;
  std::unique_ptr<SchedulerClient> scheduler_;
  int rank_ = -1;
  wire::ClusterTable table_;
  int64_t listening_ = -1;  // the limit last announced with LISTENING
};

}  // namespace gradsync
