// PsClient: recovery after a shard died or restarted (Reconnect) and elastic membership (JOIN)
// (ps_client.h).
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/base/clock.h"
#include "common/net/security.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {

Status PsClient::Reconnect(double timeout_s) {
  if (!links_.watched()) return FailedPreconditionError("no scheduler to learn the shards' new addresses from");
  const ShardLinks::Deadline deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  links_.CheckMembership();
  const std::vector<int> reconnected = links_.shards_to_reconnect();
  for (int s : reconnected) {
    RETURN_IF_ERROR(links_.Reconnect(s, deadline, timeout_s));
    channels_.Retire(s);  // the old server's channel; a new one below
  }
  // Every outstanding request is void now (the caller redoes its step).
  requests_.ForgetAll();
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
    RequestId id = requests_.New(false, {}, static_cast<int>(todo.size()));
    for (int s : todo) {
      links_.set_join_clock(s, -1);
      requests_.Send(s, requests_.Request(wire::JOIN, id, clock), Payload(), "JOIN to");
    }
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    Status st = requests_.Wait(id, std::max(0.05, left));
    std::vector<int> again;
    for (int s : todo) {
      const int64_t c = links_.join_clock(s);
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

}  // namespace gradsync
