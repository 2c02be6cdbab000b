#include "worker/ps/client/ps_requests.h"

#include <algorithm>
#include <chrono>

#include "common/base/clock.h"
#include "common/obs/trace.h"

namespace gradsync {

PsRequests::PsRequests(ShardLinks& links, WorkerChannels& channels, PsCodec& codec, const Partitioner& partitioner,
                       int rank)
    : links_(links), channels_(channels), codec_(codec), rank_(rank), replies_(links, channels, codec, partitioner) {}

PsRequests::RequestId PsRequests::New(bool is_pull, FloatSpan target, int parts, std::shared_ptr<StateGather> state) {
  RequestId id = next_id_++;
  PsPending& p = pending_[id];
  p.remaining = parts;
  p.is_pull = is_pull;
  p.target = target;
  p.state = std::move(state);
  if (Trace::on()) p.sent_us = Trace::NowUs();
  return id;
}

PsRequest PsRequests::Request(wire::Type type, RequestId id, int64_t clock) const {
  PsRequest r;
  r.type = type;
  r.worker = rank_;
  r.request_id = id;
  r.clock = clock;
  return r;
}

void PsRequests::Expect(RequestId id, int s) { pending_[id].waiting.push_back(s); }

void PsRequests::Send(int s, const PsRequest& r, const Payload& p, const char* what) {
  Expect(r.request_id, s);
  Post(s, r, p, what);
}

void PsRequests::Post(int s, const PsRequest& r, const Payload& p, const char* what) {
  Status st = links_.Send(s, r, p);
  if (!st.ok()) FailShard(s, st.WithContext(std::string(what) + " " + links_.Name(s)));
}

Result<PsReply> PsRequests::Ask(int s, PsRequest r, double timeout_s) {
  r.worker = rank_;
  r.request_id = New(false, {}, 1);
  auto answer = std::make_shared<PsReply>();
  pending_[r.request_id].answer = answer;
  Send(s, r, Payload(), "request to");
  RETURN_IF_ERROR(Wait(r.request_id, timeout_s));
  return *answer;
}

void PsRequests::FailShard(int shard, const Status& s) {
  for (auto& [id, p] : pending_) {
    auto it = std::find(p.waiting.begin(), p.waiting.end(), shard);
    if (it == p.waiting.end()) continue;
    p.waiting.erase(it);
    p.remaining--;
    if (p.status.ok()) p.status = s;
  }
}

void PsRequests::PullThrough(int s, RequestId id, PsRequest& r, int64_t whole) {
  // A job that compresses pulls wants none through a channel.
  channels_.ForPull(s, r.segments, whole, RawTo(s) && !codec_.compresses_pull()).SendPull(id, r.segments, &r.at);
}

Status PsRequests::Progress(int s) {
  RETURN_IF_ERROR(links_.Watch());
  if (links_.broken(s)) return UnavailableError(links_.Name(s) + " is dead or restarted");
  return Receive(1);
}

bool PsRequests::InFlight() const {
  for (int s = 0; s < links_.size(); ++s)
    if (channels_.lent(s) > 0) return true;
  return std::any_of(pending_.begin(), pending_.end(),
                     [](const auto& p) { return p.second.is_pull && p.second.remaining > 0 && p.second.status.ok(); });
}

Status PsRequests::Receive(int timeout_ms, RequestId until) {
  // One shard: ZeroMQ's blocking receive waits for its replies (one system call to sleep in,
  // where a poll and then a receive take several). Several: a poll says which have some.
  std::vector<size_t> ready = {0};
  int wait_ms = timeout_ms;
  if (links_.size() != 1) {
    ASSIGN_OR_RETURN(ready, links_.Poll(timeout_ms));
    wait_ms = 0;
  }
  for (size_t s : ready) {
    for (int k = 0; k < 64; ++k) {
      auto m = links_.Recv(s, k == 0 ? wait_ms : 0);
      if (!m.ok()) {
        // The wait itself failing is the error a failed poll was (other receive errors end the batch).
        if (k == 0 && wait_ms > 0 && m.status().code() != StatusCode::kDeadlineExceeded) return m.status();
        break;
      }
      HandleReply(static_cast<int>(s), *m);
      // The awaited request is done: back to the caller now, not after one more (empty) receive.
      if (until != 0) {
        auto it = pending_.find(until);
        if (it == pending_.end() || it->second.remaining <= 0 || !it->second.status.ok()) return OkStatus();
      }
    }
  }
  return OkStatus();
}

Status PsRequests::Wait(RequestId id, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  Waiter waiter(wait_, &busy_polls_);
  while (true) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return InvalidArgumentError("unknown request id " + std::to_string(id));
    // Done when every shard answered, or at the first failure (the others' replies are dropped).
    if (it->second.remaining <= 0 || !it->second.status.ok()) {
      Status s = it->second.status;
      const bool is_pull = it->second.is_pull;
      pending_.erase(it);
      // A push's lent gradient frames must be released before the caller may overwrite them.
      if (!is_pull && s.ok()) WaitForLentFrames();  // on failure the buffer is not reused
      return s;
    }
    // Dead or restarted shards, or a lost scheduler, end the wait at once.
    if (links_.watched()) {
      RETURN_IF_ERROR(links_.Watch());
      // FailShard edits the waiting list: find a broken shard, fail it, look again.
      for (bool failed = true; failed;) {
        failed = false;
        for (int s : it->second.waiting) {
          if (!links_.broken(s)) continue;
          FailShard(s, UnavailableError(links_.Name(s) + " is dead or restarted"));
          failed = true;
          break;
        }
      }
      if (it->second.remaining <= 0 || !it->second.status.ok()) continue;
    }
    const auto now = std::chrono::steady_clock::now();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    if (left <= 0) {
      std::string who;
      for (int s : it->second.waiting) who += (who.empty() ? "" : ", ") + links_.Name(s);
      return DeadlineExceededError("no reply from " + who + " within " + SecondsText(timeout_s) + " s");
    }
    if (waiter.Poll()) {
      // Polling: this thread stays runnable, so the reply is taken as soon as it is in.
      RETURN_IF_ERROR(Receive(0, id));
      continue;
    }
    RETURN_IF_ERROR(Receive(static_cast<int>(std::min<int64_t>(left, 20)), id));
  }
}

void PsRequests::WaitForLentFrames() {
  for (int s = 0; s < links_.size(); ++s) {
    // A dead shard's connection may hold frames of an earlier, failed push until Reconnect
    // replaces it: they are not waited for (that buffer's next contents never reach it).
    while (channels_.lent(s) > 0) {
      links_.CheckMembership();
      if (links_.broken(s)) break;
      YieldCore();
    }
  }
}

void PsRequests::HandleReply(int shard, const Message& m) {
  const Result<PsReply> r = m.malformed.ok() ? DecodeReply(m.header) : Result<PsReply>(m.malformed);
  // A piece of a pull answered through a lane, or a state vector of a STATE_PULL's answer, more
  // to come: its values are taken, the request stays open.
  const bool more = r.ok() && ((r->piece.parts > 1 && r->piece.part + 1 < r->piece.parts) ||
                               (r->type == wire::STATE_PULL_REPLY && r->state.slot >= 0 &&
                                r->state.slot + 1 < r->state.slots));
  bool frame_read = false;
  if (PsPending* p = Answered(shard, r.ok() ? r->request_id : TagOf(m.header).request_id, more)) {
    if (replies_.Apply(shard, m, r, more, *p, &frame_read)) {
      // Its channel broke: the same pull again, over ZeroMQ.
      PsRequest again = Request(wire::PULL, r->request_id, r->clock);
      again.segments = r->segments;
      p->remaining++;
      Send(shard, again, Payload(), "pull from");
    }
  }
  // A pull answered through a channel: its frame is read (into the target, or past it when the
  // reply was not used) before anything else comes off that channel.
  if (frame_read || !r.ok() || r->type != wire::PULL_REPLY) return;
  channels_.SkipPull(shard, m, *r);
}

PsPending* PsRequests::Answered(int shard, RequestId id, bool more) {
  auto it = pending_.find(id);
  PsPending* p = it == pending_.end() ? nullptr : &it->second;
  auto sit = p ? std::find(p->waiting.begin(), p->waiting.end(), shard) : std::vector<int>::iterator();
  const bool open = p && sit != p->waiting.end();
  if (more) return open ? p : nullptr;
  if (open) {
    p->waiting.erase(sit);
    p->remaining--;
  }
  // The shard sends no more of this request through its channel once it has answered every part.
  if (!open || std::find(p->waiting.begin(), p->waiting.end(), shard) == p->waiting.end()) {
    channels_.Forget(shard, id);
  }
  return open ? p : nullptr;  // null: a late reply to a failed request, or a duplicate
}

}  // namespace gradsync
