#include "server/requests/push_pull_service.h"

#include <optional>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/security.h"
#include "common/obs/trace.h"

namespace gradsync {

Status PushPullService::HandlePush(const PsRequest& r, Message& m) {
  // The channel its values came on lets them go at once when the push is refused or is the rest
  // of a refused one (a lane's worker waits for that before it writes its next push there).
  ShardChannel& channel = shard_.channels->For(r);
  if (shard_.core->intake().IsRestOfFailed(r.worker, r)) {  // the rest of a push whose error was the answer
    channel.Refuse(r);
    return OkStatus();
  }
  Status s = HandlePushMessage(r, m, channel);
  if (!s.ok()) {
    shard_.core->intake().Refused(r.worker, r);
    channel.Refuse(r);
  }
  return s;
}

Status PushPullService::HandleAttach(const PsRequest& r, const Message& m) {
  if (!shard_.built()) return ServerShard::NotBuilt();
  ASSIGN_OR_RETURN(PsReply reply, shard_.channels->Attach(r, shard_.core->shard(), CurveEnabled(ctx_)));
  shard_.core->intake().ForgetParts(r.worker);  // a half-sent push of it is not finished by the new channel
  return socket_.Send(m.peer, EncodeReply(reply));
}

void PushPullService::DetachWorker(int w) {
  shard_.channels->Detach(w);  // a push of it still held keeps its values through its lease
  shard_.core->intake().ForgetParts(w);  // a half-sent push of a worker that left
}

Result<PushChunk> PushPullService::ReadPush(const PsRequest& r, Message& m, ShardChannel& channel) {
  if (!shard_.built()) return ServerShard::NotBuilt();
  const int w = r.worker;
  ASSIGN_OR_RETURN(PushValues in, channel.Push(r, m, shard_.core->shard()));
  const auto keys = m.Keys(&key_buffer_);
  size_t n = in.n;
  const float* values = in.values;
  // Ranges and keys; a raw push's value count too (a compressed one's is its codec's business).
  {
    TraceSpan span("validate", "server", {{"worker", static_cast<double>(w)}, {"values", static_cast<double>(n)}});
    if (r.tables.empty()) {
      RETURN_IF_ERROR(shard_.core->shard().Validate(r.segments, keys, r.codec.empty() ? &n : nullptr, r.push.absent_tensors));
    } else {
      // Table rows: raw, over ZeroMQ (the decoder saw to it), their rows' count of values.
      RETURN_IF_ERROR(shard_.core->shard().tables().Validate(r.tables, keys, &n));
    }
  }
  if (!r.codec.empty()) {
    // A compressed push: decoded (and so validated) before it can touch anything.
    if (!keys.empty() && r.codec == shard_.codecs.spec()) return InvalidArgumentError("a compressed push carries no keys");
    n = static_cast<size_t>(TotalSize(r.segments));
    ASSIGN_OR_RETURN(values, shard_.codecs.Decode(r, m, n));
  }
  PushChunk chunk;
  if (in.lease) {
    chunk.segments = r.segments;  // where the channel lent them (a lane, a data channel's frame),
    chunk.shared = values;        // held by the lease until the chunk goes
    chunk.lease = std::move(in.lease);
  } else {
    chunk = TakeChunk(r.segments, keys, &m.values, values, n, shard_.codecs.decoded());
  }
  chunk.absent = r.push.absent_tensors;
  chunk.tables = r.tables;
  return chunk;
}

Status PushPullService::HandlePushMessage(const PsRequest& r, Message& m, ShardChannel& channel) {
  ASSIGN_OR_RETURN(PushChunk chunk, ReadPush(r, m, channel));
  if (!chunk.tables.empty()) {
    // The rows it would create must fit under the tables' bounds (a bsp round's held pushes'
    // rows counted too) before the push can count.
    RETURN_IF_ERROR(shard_.core->shard().tables().MakeRoom(chunk.tables, chunk.keys, shard_.core->rule().aggregates()));
  }
  const size_t num_keys = chunk.keys.size();
  ASSIGN_OR_RETURN(HeldPush * push, shard_.core->Accept(r, std::move(chunk), num_keys));
  if (push == nullptr) return OkStatus();  // more parts to come
  const int w = r.worker;
  // Accepted: acknowledge before applying (BytePS's recipe), so that the worker's next request
  // is on its way while the update runs; requests from one worker are still handled in order.
  const int64_t lag = shard_.core->shard().version() - r.push.version;
  stats_.version_lag[lag]++;
  stats_.pushes++;
  PsReply reply = ReplyTo(r, wire::PUSH_REPLY, registration_.rank());
  reply.staleness.version_lag = lag;
  // With backups it is acknowledged once every one holds it (its entries go as the core takes
  // it): no acknowledged push lives on this server alone.
  const bool replicated = shard_.replication->active();
  Status s = replicated ? OkStatus() : socket_.Send(m.peer, EncodeReply(reply));
  {
    std::optional<TraceSpan> span;
    if (!shard_.core->rule().aggregates()) {
      span.emplace("apply", "server", std::initializer_list<TraceArg>{
          {"worker", static_cast<double>(w)}, {"clock", static_cast<double>(r.clock)},
          {"version", static_cast<double>(shard_.core->shard().version())}});
    }
    shard_.core->Take(w, std::move(*push), lag);  // held for its round, or applied now
  }
  if (replicated) shard_.replication->HoldReply(m.peer, EncodeReply(reply));
  if (!shard_.core->rule().aggregates()) checkpoints_.Maybe(true);
  if (shard_.core->rule().RoundComplete()) ApplyRound();
  AnswerParked();
  return s;
}

void PushPullService::ApplyRound() {
  if (shard_.core->ApplyRound().pushes > 0) checkpoints_.Maybe(true);  // between rounds: nothing is held
}

Status PushPullService::HandlePull(PsRequest r, Message& m) {
  if (!shard_.built()) return ServerShard::NotBuilt();
  if (r.has_values) return InvalidArgumentError("a pull carries no values");
  const auto keys = m.Keys(&key_buffer_);
  RETURN_IF_ERROR(shard_.codecs.CheckPull(r, !keys.empty()));
  if (r.tables.empty()) {
    RETURN_IF_ERROR(shard_.core->shard().Validate(r.segments, keys, nullptr));
  } else {
    RETURN_IF_ERROR(shard_.core->shard().tables().Validate(r.tables, keys, nullptr));
  }
  RETURN_IF_ERROR(shard_.channels->For(r).CheckPull(r, !keys.empty()));
  RETURN_IF_ERROR(shard_.core->rule().ValidatePull(r.worker, r.clock));
  if (shard_.core->rule().CanAnswerPull(r.worker, r.clock)) {
    AnswerPull(r, m, keys, 0.0);
  } else if (auto blocker = shard_.core->rule().Blocker(r.worker, r.clock)) {
    // A worker that ended training will never push what this pull waits for.
    return shard_.core->rule().BlockedError(r.clock, *blocker);
  } else {
    shard_.parked.Park(std::move(r), std::move(m), SteadyMs());
  }
  return OkStatus();
}

void PushPullService::RecordPull(const PsRequest& r, int64_t clock_staleness) {
  stats_.pulls++;
  stats_.clock_staleness[clock_staleness]++;
  if (record_pulls_) {
    pull_log_.push_back({r.worker, r.clock, shard_.core->rule().clocks().min_live_clock(), shard_.core->rule().clocks().rounds_applied(),
                         shard_.core->shard().version(), clock_staleness});
  }
}

void PushPullService::AnswerPull(const PsRequest& r, const Message& m, std::span<const uint64_t> keys, double waited_ms) {
  const uint64_t n = keys.size() + TotalSize(r.segments);
  TraceSpan span("answer pull", "server", {{"worker", static_cast<double>(r.worker)}, {"clock", static_cast<double>(r.clock)},
                                           {"values", static_cast<double>(n)}});
  PsReply reply = ReplyTo(r, wire::PULL_REPLY, registration_.rank());
  reply.version = shard_.core->shard().version();
  reply.staleness.wait_ms = waited_ms;
  reply.staleness.clock_staleness = shard_.core->rule().ClockStaleness(r.clock);
  reply.segments = r.segments;
  reply.tables = r.tables;
  if (Status s = shard_.channels->AnswerPull(r, m, reply, keys, shard_.core->shard()); !s.ok()) return replies_.Reply(m, s);
  shard_.core->Pulled(r.worker, r.segments);  // delay compensation: what this worker now computes on
  RecordPull(r, reply.staleness.clock_staleness);
}

void PushPullService::AnswerParked() {
  const double now = SteadyMs();
  for (ParkedRequests::Due& due : shard_.parked.TakeDue(shard_.core->rule())) {
    ParkedRequests::Parked& p = due.parked;
    if (!due.refused.ok()) {
      GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": pull " << p.pull.clock << " of worker " << p.pull.worker
                            << " can never be answered: " << due.refused.message();
      replies_.Reply(p.msg, due.refused);
      continue;
    }
    if (Trace::on()) {
      // Held by the consistency rule until the push just counted let it through.
      const double held_us = (now - p.since_ms) * 1e3;
      Trace::Complete("pull held", "server", Trace::NowUs() - held_us, held_us,
                      {{"worker", static_cast<double>(p.pull.worker)}, {"clock", static_cast<double>(p.pull.clock)},
                       {"waited for worker", static_cast<double>(shard_.core->intake().last_counted())}});
    }
    if (p.pull.type == wire::STATE_PULL) {
      state_.AnswerPull(p.pull, p.msg);
    } else {
      AnswerPull(p.pull, p.msg, p.msg.Keys(&key_buffer_), now - p.since_ms);
    }
  }
  // Optimizer states waiting for their quiescent point.
  for (StateSets::Due& due : shard_.core->state_sets().TakeDue(shard_.core->rule())) {
    if (due.refused.ok()) {
      state_.Apply(std::move(due.set));
    } else {
      replies_.Reply(due.set.peer, due.set.first.request_id, due.set.first.clock, due.refused);
    }
  }
}

}  // namespace gradsync
