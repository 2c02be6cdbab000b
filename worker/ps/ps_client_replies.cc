// PsClient: waiting for replies and taking them (ps_client.h).
#include <algorithm>
#include <chrono>

#include "common/base/clock.h"
#include "common/obs/trace.h"
#include "worker/ps/ps_client.h"

namespace gradsync {

Status PsClient::Receive(int timeout_ms, RequestId until) {
  // One shard: ZeroMQ's blocking receive waits for its replies (one system call to sleep in,
  // where a poll and then a receive take several). Several: a poll says which have some.
  std::vector<size_t> ready = {0};
  int wait_ms = timeout_ms;
  if (sockets_.size() != 1) {
    ASSIGN_OR_RETURN(ready, PollReadable(sockets_, timeout_ms));
    wait_ms = 0;
  }
  for (size_t s : ready) {
    for (int k = 0; k < 64; ++k) {
      auto m = sockets_[s].Recv(k == 0 ? wait_ms : 0);
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

Status PsClient::Wait(RequestId id, double timeout_s) {
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
    if (scheduler_) {
      if (Status h = scheduler_->health(); !h.ok()) return h;
      CheckMembership();
      // FailShard edits the waiting list: find a broken shard, fail it, look again.
      for (bool failed = true; failed;) {
        failed = false;
        for (int s : it->second.waiting) {
          if (!shards_[static_cast<size_t>(s)].broken) continue;
          FailShard(s, UnavailableError(Name(s) + " is dead or restarted"));
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
      for (int s : it->second.waiting) who += (who.empty() ? "" : ", ") + Name(s);
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

void PsClient::WaitForLentFrames() {
  for (Shard& shard : shards_) {
    // A dead shard's connection may hold frames of an earlier, failed push until Reconnect
    // replaces it: they are not waited for (that buffer's next contents never reach it).
    while (shard.lent->count() > 0) {
      CheckMembership();
      if (shard.broken) break;
      YieldCore();
    }
  }
}

void PsClient::HandleReply(int shard, const Message& m) {
  const Result<PsReply> r = m.malformed.ok() ? DecodeReply(m.header) : Result<PsReply>(m.malformed);
  bool frame_read = false;
  ApplyReply(shard, m, r, &frame_read);
  // A pull answered through a channel: its frame is read (into the target, or past it when the
  // reply was not used) before anything else comes off that channel.
  if (frame_read || !r.ok() || r->type != wire::PULL_REPLY || !r->at.outside()) return;
  if (WorkerChannel* channel = channels_.Of(shard, r->at.channel)) {
    if (Status st = channel->ReadPull(*r, nullptr); !st.ok()) channels_.Drop(shard, st);
  }
}

PsClient::Pending* PsClient::Answered(int shard, RequestId id, bool more) {
  auto it = pending_.find(id);
  Pending* p = it == pending_.end() ? nullptr : &it->second;
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

void PsClient::ApplyReply(int shard, const Message& m, const Result<PsReply>& decoded, bool* frame_read) {
  // A piece of a pull answered through a lane, or a state vector of a STATE_PULL's answer, more
  // to come: its values are taken, the request stays open.
  const bool more = decoded.ok() && ((decoded->parts > 1 && decoded->part + 1 < decoded->parts) ||
                                     (decoded->type == wire::STATE_PULL_REPLY && decoded->state_slot >= 0 &&
                                      decoded->state_slot + 1 < decoded->state_slots));
  Pending* p = Answered(shard, decoded.ok() ? decoded->request_id : TagOf(m.header).request_id, more);
  if (!p) return;
  auto fail = [&](Status s) {
    if (p->status.ok()) p->status = std::move(s);
  };
  if (!decoded.ok()) {
    fail(DataLossError("malformed reply from " + Name(shard) + ": " + decoded.status().message()));
    return;
  }
  const PsReply& r = *decoded;
  Shard& from = shards_[static_cast<size_t>(shard)];
  switch (r.type) {
    case wire::ERROR: fail(r.error); return;
    case wire::PUSH_REPLY:
      from.version_lag = static_cast<double>(r.version_lag);
      ++counts_.pushes;
      ++counts_.version_lag[r.version_lag];
      return;
    case wire::JOIN_REPLY: from.join_clock = r.clock; from.version = r.version; return;
    case wire::CHANNEL_ATTACH_REPLY:
      if (p->answer) *p->answer = r;
      return;
    case wire::STATE_PULL_REPLY:
      if (Status st = TakeStateReply(shard, m, r, *p); !st.ok()) fail(st);
      return;
    case wire::PULL_REPLY: break;
    default: return;
  }
  if (!p->is_pull) return;
  auto taken = TakePull(shard, m, r, *p, frame_read);
  if (!taken.ok()) {
    fail(taken.status());
    return;
  }
  if (!*taken) return;  // asked again
  from.version = r.version;
  from.wait_ms = r.wait_ms;
  from.clock_staleness = r.clock_staleness;
  NotePull(shard, m, r, *p, more);
}

Result<bool> PsClient::TakePull(int shard, const Message& m, const PsReply& r, Pending& p, bool* frame_read) {
  // The reply's values go where its segments and keys say, once checked to fit.
  const Segment& range = partitioner_.range(shard);
  const int64_t n = static_cast<int64_t>(p.target.size());
  for (const Segment& seg : r.segments) {
    if (seg.begin < range.begin || seg.end < seg.begin || seg.end > range.end || seg.end > n) {
      return DataLossError("pull reply from " + Name(shard) + " is out of range");
    }
  }
  if (!r.codec.empty()) {
    // A compressed delta since the last pull: decoded (and so validated) whole, then added.
    if (!codec_.pull_decoder || r.codec != codec_.spec || r.num_keys > 0) {
      return DataLossError("unexpected compressed pull reply ('" + r.codec + "') from " + Name(shard));
    }
    TraceSpan decode("decode", "comm", {{"shard", static_cast<double>(shard)}, {"bytes", static_cast<double>(m.values.size())}});
    RETURN_IF_ERROR(codec_.pull_decoder->AddTo(m.values.bytes(), r.segments, r.clock, p.target)
                        .WithContext("pull reply from " + Name(shard)));
    return true;
  }
  if (!r.at.outside()) {
    RETURN_IF_ERROR(TakeZmqPull(shard, m, r, p));
    return true;
  }
  *frame_read = true;
  WorkerChannel* channel = channels_.Of(shard, r.at.channel);
  if (r.has_values || r.num_keys > 0 || (!channel && r.at.channel == wire::CHANNEL_LANE)) {
    return DataLossError("unexpected pull reply through a value channel from " + Name(shard));
  }
  Status st = channel ? channel->ReadPull(r, p.target.data()) : UnavailableError("its value channel was dropped");
  if (st.ok()) return true;
  // The channel broke: the shard may be dying (then its death, once the scheduler declares it,
  // fails the request as any dead shard's does, and recovery takes over) or only the channel.
  // Either way the same pull goes again, over ZeroMQ.
  channels_.Drop(shard, st);
  PsRequest again = Request(wire::PULL, r.request_id, r.clock);
  again.segments = r.segments;
  p.remaining++;
  Send(shard, again, Payload(), "pull from");
  return false;
}

Status PsClient::TakeZmqPull(int shard, const Message& m, const PsReply& r, Pending& p) {
  const Segment& range = partitioner_.range(shard);
  size_t pos = 0;
  for (const Segment& seg : r.segments) {
    m.CopyValues(p.target.data() + seg.begin, pos, static_cast<size_t>(seg.size()));
    pos += static_cast<size_t>(seg.size());
  }
  const auto keys = m.Keys(&scratch_.keys);
  scratch_.key_values.resize(keys.size());
  m.CopyValues(scratch_.key_values.data(), pos, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] < static_cast<uint64_t>(range.begin) || keys[i] >= static_cast<uint64_t>(range.end)) {
      return DataLossError("pull reply key out of range");
    }
    p.target[keys[i]] = scratch_.key_values[i];
  }
  return OkStatus();
}

void PsClient::NotePull(int shard, const Message& m, const PsReply& r, const Pending& p, bool more) {
  if (more) return;
  ++counts_.pulls;
  ++counts_.clock_staleness[r.clock_staleness];
  if (p.sent_us >= 0 && Trace::on()) {
    // From the request to this shard's (last) reply: the wait, the shard's work, the transfer.
    const double values = static_cast<double>(TotalSize(r.segments) + r.num_keys);
    Trace::Complete("pull", "comm", p.sent_us, Trace::NowUs() - p.sent_us,
                    {{"shard", static_cast<double>(shard)}, {"clock", static_cast<double>(r.clock)},
                     {"bytes", r.codec.empty() ? values * sizeof(float) : static_cast<double>(m.values.size())},
                     {"held ms", r.wait_ms}});
  }
}

Status PsClient::TakeStateReply(int shard, const Message& m, const PsReply& r, Pending& p) {
  const std::string who = Name(shard);
  if (!p.state) return DataLossError("an optimizer state from " + who + " that was not asked for");
  StateGather::Shard& got = p.state->shards[static_cast<size_t>(shard)];
  const Segment& range = partitioner_.range(shard);
  const size_t n = static_cast<size_t>(range.size());
  const bool same = got.received == 0 || (r.optimizer == got.kind && r.steps == got.steps && r.skipped == got.skipped &&
                                           r.state_slots == got.slots);
  const bool fits = r.state_slots > 0 ? r.segments.size() == 1 && r.segments[0] == range && m.num_values() == n &&
                                            r.num_keys == 0
                                      : !r.has_values && r.num_keys == 0;
  if (r.state_slot != got.received || !same || !fits) {
    return DataLossError("optimizer state vector " + std::to_string(r.state_slot) + " of " +
                         std::to_string(r.state_slots) + " from " + who + " is not the one due or not its range");
  }
  if (got.received == 0) {
    got.kind = r.optimizer;
    got.steps = r.steps;
    got.skipped = r.skipped;
    got.slots = r.state_slots;
    got.values.assign(static_cast<size_t>(r.state_slots) * n, 0.0f);
  }
  if (r.state_slots > 0) m.CopyValues(got.values.data() + static_cast<size_t>(r.state_slot) * n);
  got.received++;
  return OkStatus();
}

}  // namespace gradsync
