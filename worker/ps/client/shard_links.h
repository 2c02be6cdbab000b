// ShardLinks: a worker's connections to the parameter server's shards: one ZeroMQ socket per
// shard (the job's message limit on both sides), what the scheduler said of each (dead or
// restarted: broken until Reconnect replaces its connection), the per-shard facts replies set
// (the version of the last pull reply, the clock of the last JOIN_REPLY), and the bytes of every
// connection, the replaced ones' included.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

class ShardLinks {
 public:
  using Deadline = std::chrono::time_point<std::chrono::steady_clock, std::chrono::duration<double>>;

  // `scheduler` (may be null) reports dead and restarted servers.
  ShardLinks(TransportContext& ctx, const wire::ClusterTable& table, int rank, SchedulerClient* scheduler);
  // Connects to every server of the table; their replies may be up to max_message_bytes.
  Status Connect(int64_t max_message_bytes);

  int size() const { return table_.servers_size(); }
  // The job's table, with the addresses Reconnect moved to.
  const wire::ClusterTable& table() const { return table_; }
  std::string Name(int s) const;

  // Sends request r to shard s.
  Status Send(int s, const PsRequest& r, const Payload& p);
  // The shards whose sockets have a message within timeout_ms.
  Result<std::vector<size_t>> Poll(int timeout_ms);
  Result<Message> Recv(size_t s, int timeout_ms);

  // Whether a scheduler watches the shards; Watch: its health, and its news taken in (below).
  bool watched() const { return scheduler_ != nullptr; }
  Status Watch();
  // Marks the shards whose server the scheduler declared dead or saw restart as broken.
  void CheckMembership();
  bool broken(int s) const { return shards_[static_cast<size_t>(s)].broken; }
  std::vector<int> shards_to_reconnect() const;
  // Waits (until `deadline`; timeout_s for the message) until the scheduler has shard s back,
  // then connects to its new address: the old connection and what it held are dropped.
  Status Reconnect(int s, Deadline deadline, double timeout_s);

  int64_t version(int s) const { return shards_[static_cast<size_t>(s)].version; }
  void set_version(int s, int64_t v) { shards_[static_cast<size_t>(s)].version = v; }
  int64_t join_clock(int s) const { return shards_[static_cast<size_t>(s)].join_clock; }
  void set_join_clock(int s, int64_t c) { shards_[static_cast<size_t>(s)].join_clock = c; }
  // Every connection's bytes, the replaced ones' included.
  TrafficCounters traffic() const;

 private:
  // One shard: what the scheduler and the replies said of it.
  struct Shard {
    bool broken = false;      // dead or restarted: needs Reconnect
    int64_t join_clock = -1;  // the last JOIN_REPLY's clock
    int64_t version = 0;      // of the last pull reply
  };
  // The scheduler's news seen so far (CheckMembership).
  struct NewsSeen {
    uint64_t events = 0;
    size_t joined = 0;
  };

  TransportContext& ctx_;
  wire::ClusterTable table_;
  int rank_;
  SchedulerClient* scheduler_;
  NewsSeen seen_;
  std::vector<Shard> shards_;
  std::vector<Socket> sockets_;      // per shard, its connection
  TrafficCounters retired_traffic_;  // of the connections Reconnect replaced
  int64_t max_message_bytes_ = kMaxControlMessageBytes;  // both ways (MaxShardMessageBytes)
};

}  // namespace gradsync
