#include "worker/channels/worker_lane.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace gradsync {
namespace {
// How long a push waits for a shard to release its lane's push area (bsp: until the round of the
// previous push is applied, which a normal step, pulling in between, never waits for).
constexpr int kLaneWaitSeconds = 600;
// Yields a push makes for the lane before it handles replies, whatever the polling asked for.
constexpr int kOpenPushPolls = 256;
}  // namespace

Result<std::unique_ptr<WorkerLane>> WorkerLane::Attach(const Segment& range, const AskShard& ask, double timeout_s) {
  if (range.size() <= 0) return FailedPreconditionError("an empty range");
  ASSIGN_OR_RETURN(ShmLane lane, ShmLane::Create(range.size()));
  PsRequest r;
  r.type = wire::CHANNEL_ATTACH;
  r.segments = {range};
  r.at.channel = wire::CHANNEL_LANE;
  r.at.attach = lane.name();
  Result<PsReply> reply = ask(std::move(r), timeout_s);
  lane.Unpublish();  // mapped on both sides (or refused): no one else can map it
  if (!reply.ok()) return reply.status();
  return std::unique_ptr<WorkerLane>(new WorkerLane(std::move(lane), range));
}

bool WorkerLane::TakesPush(std::span<const Segment> segments, int64_t) const {
  return !segments.empty() && Contiguous(segments);
}

bool WorkerLane::TakesPull(std::span<const Segment> segments, int64_t) const {
  if (segments.empty()) return false;
  // Never two answers in flight for the same elements: the second would overwrite the first
  // while it is being read. Such a pull goes over ZeroMQ instead.
  for (const auto& [id, seg] : pulls_)
    for (const Segment& want : segments)
      if (want.begin < seg.end && seg.begin < want.end) return false;
  return true;
}

Status WorkerLane::OpenPush(const WaitPolicy& wait, const Progress& progress) {
  auto free = [&] { return lane_.consumed() >= sent_; };
  // The shard usually lets go within microseconds: the client's polling, and at least
  // kOpenPushPolls yields, before replies are handled.
  WaitPolicy policy = wait;
  policy.min_polls = std::max(policy.min_polls, kOpenPushPolls);
  for (Waiter waiter(policy); !free() && waiter.Poll();) {
  }
  // The shard holds the previous push (bsp: until its round is applied). Replies are handled
  // meanwhile, and a dead shard ends the wait.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kLaneWaitSeconds);
  while (!free()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError("the shard has not released its shared-memory push area in " +
                                   std::to_string(kLaneWaitSeconds) + " s");
    }
    RETURN_IF_ERROR(progress());
  }
  ++sent_;
  return OkStatus();
}

Status WorkerLane::SendPush(const PushSource& v, ValueRef* at, Payload*) {
  float* area = lane_.push_area();
  for (const Segment& run : v.runs) {
    std::memcpy(area + (run.begin - range_.begin), v.grads.data() + run.begin, static_cast<size_t>(run.size()) * sizeof(float));
    bytes_.pushed += static_cast<uint64_t>(run.size()) * sizeof(float);
  }
  at->channel = wire::CHANNEL_LANE;
  at->seq = sent_;
  return OkStatus();
}

void WorkerLane::SendPull(RequestId id, std::span<const Segment> segments, ValueRef* at) {
  for (const Segment& seg : segments) pulls_.push_back({id, seg});
  at->channel = wire::CHANNEL_LANE;
}

Status WorkerLane::ReadPull(const Message&, const PsReply& r, float* target, Status*) {
  if (target == nullptr) return OkStatus();
  const float* area = lane_.pull_area();
  for (const Segment& seg : r.segments) {
    std::memcpy(target + seg.begin, area + (seg.begin - range_.begin), static_cast<size_t>(seg.size()) * sizeof(float));
    bytes_.pulled += static_cast<uint64_t>(seg.size()) * sizeof(float);
  }
  return OkStatus();
}

void WorkerLane::Forget(RequestId id) {
  std::erase_if(pulls_, [id](const auto& e) { return e.first == id; });
}

}  // namespace gradsync
