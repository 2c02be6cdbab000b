// PsClient: membership (dead and restarted shards, Reconnect, JOIN) and attaching value channels
// (ps_client.h).
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/control/node.h"
#include "common/net/security.h"
#include "worker/ps/ps_client.h"

namespace gradsync {

void PsClient::CheckMembership() {
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

std::vector<int> PsClient::shards_to_reconnect() const {
  std::vector<int> out;
  for (int s = 0; s < table_.servers_size(); ++s)
    if (shards_[static_cast<size_t>(s)].broken) out.push_back(s);
  return out;
}

Status PsClient::Reconnect(double timeout_s) {
  if (!scheduler_) return FailedPreconditionError("no scheduler to learn the shards' new addresses from");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  CheckMembership();
  const std::vector<int> reconnected = shards_to_reconnect();
  for (int s : reconnected) {
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
    channels_.Retire(s);  // the old server's channel; a new one below
    GRADSYNC_LOG(WARNING) << "worker " << rank_ << ": reconnected to " << NodeName(info) << " at " << info.host() << ":"
                          << info.port();
  }
  // Every outstanding request is void now (the caller redoes its step).
  pending_.clear();
  channels_.ForgetAll();
  auto left = [&] {
    return std::max(1.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
  };
  channels_.Reattach(reconnected, left, CurveEnabled(ctx_));
  return OkStatus();
}

Result<int64_t> PsClient::Join(const std::vector<int>& shards, int64_t clock, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<int> todo = shards;
  int64_t best = -1;
  while (!todo.empty()) {
    RequestId id = NewRequest(false, {}, static_cast<int>(todo.size()));
    for (int s : todo) {
      shards_[static_cast<size_t>(s)].join_clock = -1;
      Send(s, Request(wire::JOIN, id, clock), Payload(), "JOIN to");
    }
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    Status st = Wait(id, std::max(0.05, left));
    std::vector<int> again;
    for (int s : todo) {
      const int64_t c = shards_[static_cast<size_t>(s)].join_clock;
      if (c >= 0) best = std::max(best, c);
      else again.push_back(s);
    }
    if (again.empty()) break;
    // Not ready yet (the shard has not heard of this worker's rejoin, or is not initialized).
    if (!st.ok() && st.code() != StatusCode::kUnavailable) return st.WithContext("JOIN");
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError("JOIN: " + std::to_string(again.size()) + " shard(s) did not take this worker back within " +
                                   SecondsText(timeout_s) + " s" + (st.ok() ? "" : ": " + st.message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    todo = again;
  }
  return best;
}


Result<PsReply> PsClient::Ask(int s, PsRequest r, double timeout_s) {
  r.worker = rank_;
  r.request_id = NewRequest(false, {}, 1);
  auto answer = std::make_shared<PsReply>();
  pending_[r.request_id].answer = answer;
  Send(s, r, Payload(), "request to");
  RETURN_IF_ERROR(Wait(r.request_id, timeout_s));
  return *answer;
}

}  // namespace gradsync
