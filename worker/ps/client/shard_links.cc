#include "worker/ps/client/shard_links.h"

#include <thread>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/control/node.h"

namespace gradsync {

ShardLinks::ShardLinks(TransportContext& ctx, const wire::ClusterTable& table, int rank, SchedulerClient* scheduler)
    : ctx_(ctx), table_(table), rank_(rank), scheduler_(scheduler), shards_(static_cast<size_t>(table.servers_size())) {
  // News from before this client existed (e.g. a rejoining worker learns of dead nodes) counts.
  if (scheduler_) seen_.joined = scheduler_->news().joined_nodes().size();
}

Status ShardLinks::Connect(int64_t max_message_bytes) {
  max_message_bytes_ = max_message_bytes;
  for (int s = 0; s < table_.servers_size(); ++s) {
    const wire::NodeInfo& info = table_.servers(s);
    ASSIGN_OR_RETURN(Socket sock, Socket::ConnectDealer(ctx_, "tcp://" + info.host() + ":" + std::to_string(info.port()),
                                                        NodeName(info), max_message_bytes_));
    sockets_.push_back(std::move(sock));
  }
  return OkStatus();
}

std::string ShardLinks::Name(int s) const { return NodeName(table_.servers(s)); }

Status ShardLinks::Send(int s, const PsRequest& r, const Payload& p) {
  return sockets_[static_cast<size_t>(s)].Send("", EncodeRequest(r), p);
}

Result<std::vector<size_t>> ShardLinks::Poll(int timeout_ms) { return PollReadable(sockets_, timeout_ms); }

Result<Message> ShardLinks::Recv(size_t s, int timeout_ms) { return sockets_[s].Recv(timeout_ms); }

Status ShardLinks::Watch() {
  if (!scheduler_) return OkStatus();
  RETURN_IF_ERROR(scheduler_->health());
  CheckMembership();
  return OkStatus();
}

void ShardLinks::CheckMembership() {
  if (!scheduler_ || scheduler_->events() == seen_.events) return;
  seen_.events = scheduler_->events();
  for (int s = 0; s < table_.servers_size(); ++s) {
    if (scheduler_->IsDead(wire::SERVER, s)) shards_[static_cast<size_t>(s)].broken = true;
  }
  const auto joined = scheduler_->news().joined_nodes();
  for (; seen_.joined < joined.size(); ++seen_.joined) {
    const auto& n = joined[seen_.joined];
    if (n.role() != wire::SERVER || n.rank() < 0 || n.rank() >= table_.servers_size()) continue;
    // A restart this client has not reconnected to yet (Reconnect may already have used the
    // scheduler's newer table: then the address is the one it is connected to).
    const auto& mine = table_.servers(n.rank());
    if (n.host() != mine.host() || n.port() != mine.port()) shards_[static_cast<size_t>(n.rank())].broken = true;
  }
}

std::vector<int> ShardLinks::shards_to_reconnect() const {
  std::vector<int> out;
  for (int s = 0; s < table_.servers_size(); ++s)
    if (shards_[static_cast<size_t>(s)].broken) out.push_back(s);
  return out;
}

Status ShardLinks::Reconnect(int s, Deadline deadline, double timeout_s) {
  while (scheduler_->IsDead(wire::SERVER, s)) {
    if (Status h = scheduler_->health(); !h.ok()) return h;
    if (std::chrono::steady_clock::now() > deadline) {
      return UnavailableError(Name(s) + " did not come back within " + SecondsText(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const wire::NodeInfo info = scheduler_->table().servers(s);
  ASSIGN_OR_RETURN(Socket sock, Socket::ConnectDealer(ctx_,
                                                "tcp://" + info.host() + ":" + std::to_string(info.port()), NodeName(info),
                                                max_message_bytes_));
  // The old connection and whatever it still held are dropped; its bytes still count.
  Shard& shard = shards_[static_cast<size_t>(s)];
  retired_traffic_ += sockets_[static_cast<size_t>(s)].traffic();
  sockets_[static_cast<size_t>(s)] = std::move(sock);
  *table_.mutable_servers(s) = info;
  shard.broken = false;
  shard.version = 0;
  GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": reconnected to " << NodeName(info) << " at " << info.host() << ":"
                        << info.port();
  return OkStatus();
}

TrafficCounters ShardLinks::traffic() const {
  TrafficCounters t = retired_traffic_;  // connections replaced by Reconnect: counters never go back
  for (const Socket& s : sockets_) t += s.traffic();
  return t;
}

}  // namespace gradsync
